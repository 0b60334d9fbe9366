"""The built-in catalog: coverage of the reference instance list, facts, prices, topology."""

import pytest

from trainready.catalog import load_catalog
from trainready.errors import UnknownNameError, UsageError

# Every GPU instance of the reference list (trn1 is out of scope).
REQUIRED = {
    "p4d.24xlarge": ("a100-40gb", 8, 96, 1152), "p4de.24xlarge": ("a100-80gb", 8, 96, 1152),
    "p5.48xlarge": ("h100-80gb", 8, 192, 2048), "p5e.48xlarge": ("h200", 8, 192, 2048),
    "p5en.48xlarge": ("h200", 8, 192, 2048), "p6-b200.48xlarge": ("b200", 8, 192, 2048),
    "p3.2xlarge": ("v100-16gb", 1, 8, 61), "p3.8xlarge": ("v100-16gb", 4, 32, 244),
    "p3.16xlarge": ("v100-16gb", 8, 64, 488), "p3dn.24xlarge": ("v100-32gb", 8, 96, 768),
    "g5.xlarge": ("a10g", 1, 4, 16), "g5.12xlarge": ("a10g", 4, 48, 192), "g5.48xlarge": ("a10g", 8, 192, 768),
    "g6.12xlarge": ("l4", 4, 48, 192), "g6.48xlarge": ("l4", 8, 192, 768),
    "g6e.12xlarge": ("l40s", 4, 48, 384), "g6e.48xlarge": ("l40s", 8, 192, 1536),
    "a2-highgpu-8g": ("a100-40gb", 8, 96, 680), "a2-ultragpu-8g": ("a100-80gb", 8, 96, 1360),
    "a3-highgpu-8g": ("h100-80gb", 8, 208, 1872), "Standard_ND96asr_v4": ("a100-40gb", 8, 96, 900),
    "Standard_ND96amsr_A100_v4": ("a100-80gb", 8, 96, 1800), "Standard_ND96isr_H100_v5": ("h100-80gb", 8, 96, 1900),
    "gpu_8x_a100_80gb_sxm4": ("a100-80gb", 8, 240, 1800), "gpu_8x_h100_sxm5": ("h100-80gb", 8, 208, 1800),
}


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_reference_instances_present(catalog, name):
    inst = catalog.instance(name)
    gpu, count, vcpus, ram = REQUIRED[name]
    assert (inst.gpu, inst.gpu_count, inst.vcpus, inst.ram_gib) == (gpu, count, vcpus, ram)
    assert inst.source
    for price in inst.price:
        assert price.source and price.region and price.as_of


def test_trainium_out_of_scope(catalog):
    with pytest.raises(UnknownNameError):
        catalog.instance("trn1.32xlarge")


def test_prices_by_region_and_model(catalog):
    p4d = catalog.instance("p4d.24xlarge")
    assert p4d.price_for("on-demand", "us-east-1").usd_per_hour == pytest.approx(21.957642)
    assert p4d.price_for("spot").usd_per_hour == pytest.approx(2.4655)
    assert p4d.price_for("on-demand", "eu-west-1") is None


def test_suspect_prices_stay_marked(catalog):
    assert catalog.instance("a2-ultragpu-8g").price_for("on-demand").suspect
    assert catalog.instance("a3-highgpu-8g").price_for("on-demand").suspect
    assert catalog.instance("Standard_ND96asr_v4").price_for("spot").suspect
    assert not catalog.instance("p4d.24xlarge").price_for("on-demand").suspect


def test_unsourced_facts_are_unknown_not_guessed(catalog):
    assert catalog.instance("p5e.48xlarge").price_for("on-demand").usd_per_hour is None
    for name in ("a2-highgpu-8g", "Standard_ND96isr_H100_v5", "gpu_8x_h100_sxm5"):
        inst = catalog.instance(name)
        assert inst.nvme_count is None and inst.network_gbps is None
    assert catalog.instance("p3.8xlarge").expected_nvlink is None  # no source for its pattern


def test_expected_nvlink_topologies(catalog):
    p4d = catalog.instance("p4d.24xlarge").expected_nvlink
    assert all(p4d[i][j] == (0 if i == j else 12) for i in range(8) for j in range(8))
    p5 = catalog.instance("p5.48xlarge").expected_nvlink
    assert {p5[i][j] for i in range(8) for j in range(8) if i != j} == {18}
    cube = catalog.instance("p3.16xlarge").expected_nvlink
    assert all(sum(row) == 6 for row in cube)  # V100: 6 NVLinks per GPU
    assert sum(v == 0 for i, row in enumerate(cube) for j, v in enumerate(row) if i != j) == 24  # SYS pairs
    assert cube == catalog.instance("p3dn.24xlarge").expected_nvlink
    g5 = catalog.instance("g5.48xlarge")
    assert g5.topology == "pcie" and not any(v for row in g5.expected_nvlink for v in row)


@pytest.mark.parametrize("alias,name", [
    ("A100-SXM4-80GB", "a100-80gb"), ("a100_80gb", "a100-80gb"), ("A100-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("h100-80gb", "h100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("h100-pcie", "h100-pcie"), ("H200", "h200"), ("Tesla V100-SXM2-32GB", "v100-32gb"), ("NVIDIA A10G", "a10g"),
])
def test_gpu_aliases(catalog, alias, name):
    assert catalog.gpu(alias).name == name


def test_unknown_gpu_names_nearest(catalog):
    with pytest.raises(UnknownNameError) as exc:
        catalog.gpu("a100-90gb")
    assert exc.value.suggestions[0] in ("a100-80gb", "a100-40gb")
    assert exc.value.exit_code == 2 and "a100-80gb" in str(exc.value)


def test_gpu_peaks(catalog):
    h100 = catalog.gpu("h100-80gb")
    assert (h100.peak_tflops("bf16"), h100.peak_tflops("fp8"), h100.nvlink_links) == (989, 1979, 18)
    assert catalog.gpu("v100-16gb").peak_tflops("bf16") is None
    assert catalog.gpu("a10g").uncertain


def test_user_catalog_merges_prices_and_adds_nodes(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('''
[[instance]]
name = "p4d.24xlarge"
[[instance.price]]
region = "us-east-1"
model = "on-demand"
usd_per_hour = 15.5

[[instance]]
name = "onprem-8xa100"
cloud = "onprem"
gpu = "A100-SXM4-80GB"
gpu_count = 8
ram_gib = 1024
topology = "nvswitch"
nvlink_all_pairs = 12
[[instance.price]]
region = "dc1"
model = "on-demand"
usd_per_hour = 9.0
''')
    cat = load_catalog(f)
    p4d = cat.instance("p4d.24xlarge")
    assert p4d.price_for("on-demand", "us-east-1").usd_per_hour == 15.5
    assert p4d.price_for("spot").usd_per_hour == pytest.approx(2.4655)  # kept
    assert p4d.vcpus == 96  # fields not given are kept
    onprem = cat.instance("onprem-8xa100")
    assert onprem.gpu == "a100-80gb" or cat.gpu(onprem.gpu).name == "a100-80gb"


def test_user_catalog_errors_name_file_line_and_field(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[[instance]]\nname = "x"\ncloud = "onprem"\ngpu = "a100-80gb"\ngpu_count = "eight"\n'
                 'topology = "nvswitch"\n')
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert f"{f}:5" in str(exc.value) and "gpu_count" in str(exc.value)
    f.write_text('[[instance]]\nname = "p4d.24xlarge"\nnetwrok_gbps = 400\n')
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert f"{f}:3" in str(exc.value) and "netwrok_gbps" in str(exc.value)
    f.write_text('[[instance]\nname = ')
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert "line 1" in str(exc.value)
