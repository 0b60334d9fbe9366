"""The catalog as a user meets it: names and aliases resolve (or fail with the nearest valid
ones), a user's catalog file is merged or refused with the file, line and key named, and the
built-in facts agree with the public sources they were taken from, read independently from
../shared/reference (those tests are skipped where that directory is absent)."""

import csv
from pathlib import Path

import pytest

from trainready.catalog import load_catalog
from trainready.errors import UnknownNameError, UsageError
from trainready.plan.estimate import estimate_setup
from trainready.plan.job import JobSpec
from trainready.plan.setup import resolve

REF = Path(__file__).resolve().parents[2] / "shared" / "reference"
needs_reference = pytest.mark.skipif(not REF.is_dir(), reason=f"{REF} (public reference data) is not here")


def _csv(name: str) -> list[dict[str, str]]:
    lines = [ln for ln in (REF / name).read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def _instances_ref() -> list[dict[str, str]]:
    if not REF.is_dir():
        return []
    return [r for r in _csv("instances.csv") if not r["instance_type"].startswith("trn")]  # Trainium: out of scope


def _topo(name: str):
    from trainready.check.parsers.nvsmi import parse_topo

    return parse_topo((REF / "fixtures" / name).read_text())


# ------------------------------------------------------------------ the facts against their sources

@needs_reference
@pytest.mark.parametrize("row", _instances_ref(), ids=lambda r: r["instance_type"])
def test_instance_facts_and_prices_match_the_skypilot_snapshot(catalog, row):
    inst = catalog.instance(row["instance_type"])
    gpu = catalog.gpu_of(inst)
    assert inst.gpu_count == int(row["accel_count"])
    # AWS's MiB figure is nominal; the catalog holds what nvidia-smi reports (H100: 81559 of 81920)
    assert gpu.memory_gib * 1024 == pytest.approx(int(row["gpu_mem_per_accel_MiB"]), rel=0.015)
    assert (inst.vcpus, inst.ram_gib) == (int(row["vcpus"]), float(row["memory_GiB"]))
    for model, column in (("on-demand", "ondemand_usd_hr"), ("spot", "spot_usd_hr_min")):
        price = inst.price_for(model, row["price_region"])
        if row[column]:
            assert price.usd_per_hour == pytest.approx(float(row[column]))
        else:  # the source has no price: the catalog says unknown rather than guessing one
            assert price is None or price.usd_per_hour is None


@needs_reference
def test_every_gpu_instance_of_the_reference_is_in_the_catalog(catalog):
    for row in _instances_ref():
        catalog.instance(row["instance_type"])  # raises UnknownNameError when missing
    with pytest.raises(UnknownNameError):
        catalog.instance("trn1.32xlarge")


@needs_reference
@pytest.mark.parametrize("row", _csv("gpus.csv") if REF.is_dir() else [], ids=lambda r: r["gpu"])
def test_gpu_peaks_and_links_match_the_datasheet_table(catalog, row):
    gpu = catalog.gpu(row["gpu"])  # the datasheet's name resolves through the aliases
    for precision in ("bf16", "fp16", "fp8", "tf32", "fp32"):
        ref = row[f"{precision}_tflops"]
        ours = gpu.peak_tflops(precision)
        if gpu.uncertain and precision in ("bf16", "fp16", "tf32"):
            continue  # the A10G: sources disagree; the catalog says so and which figures it uses (TF32 half of BF16)
        assert ours == (float(ref) if ref else None), precision
    assert gpu.hbm_gbps == float(row["hbm_gbps"])
    assert gpu.nvlink_links == (int(row["nvlink_links"]) if row["nvlink_links"] else None)
    if row["nvlink_link_gbps_per_dir"]:
        assert gpu.nvlink_link_gbps == float(row["nvlink_link_gbps_per_dir"])


@needs_reference
@pytest.mark.parametrize("fixture,instances", [
    ("nvidia-smi-topo-m_8xA100-SXM4_NVSwitch_10xmlx5_NV12-PXB-SYS.txt", ["p4d.24xlarge", "p4de.24xlarge"]),
    ("nvidia-smi-topo-m_HGX-H200-or-H100_8GPU_NV18_12xmlx5_full.txt",
     ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "a3-highgpu-8g"]),
    ("nvidia-smi-topo-m_8xV100-SXM2-32GB_hybrid-cube-mesh_NV1-NV2-SYS.txt", ["p3dn.24xlarge", "p3.16xlarge"]),
    ("nvidia-smi-topo-m_8GPU_PCIe-only_NODE-SYS_noNVLink.txt", ["g5.48xlarge", "g6.48xlarge", "g6e.48xlarge"]),
])
def test_expected_nvlink_matrix_is_what_nvidia_smi_prints_on_such_a_machine(catalog, fixture, instances):
    seen = _topo(fixture).nvlink_pairs()
    assert len(seen) == 28  # every pair of 8 GPUs
    for name in instances:
        want = catalog.instance(name).expected_nvlink  # derived from nvlink_all_pairs / nvlink_matrix
        assert {pair: want[pair[0]][pair[1]] for pair in seen} == seen, name


@needs_reference
@pytest.mark.parametrize("fixture", ["nvidia-smi-nvlink-s_4xA100-SXM4-80GB_12links.txt",
                                     "nvidia-smi-nvlink-s_8xV100-SXM2-32GB_6links.txt",
                                     "nvidia-smi-nvlink-status_8xH100_18links_SNIPPED.txt"])
def test_nvlink_count_and_speed_are_what_nvidia_smi_reports(catalog, fixture):
    from trainready.check.parsers.nvsmi import parse_nvlink_status

    status = parse_nvlink_status((REF / "fixtures" / fixture).read_text())
    for links in status.gpus.values():
        gpu = catalog.gpu(links.name)  # "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB": real device names
        assert {link.speed_gbps for link in links.links} == {gpu.nvlink_link_gbps}
        if "SNIPPED" not in fixture:
            assert links.active_links == gpu.nvlink_links


# ------------------------------------------------------------------ lookups

@pytest.mark.parametrize("alias,name", [
    ("A100-SXM4-80GB", "a100-80gb"), ("a100_80gb", "a100-80gb"), ("A100-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("h100-80gb", "h100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("h100-pcie", "h100-pcie"), ("H200", "h200"), ("Tesla V100-SXM2-32GB", "v100-32gb"), ("NVIDIA A10G", "a10g"),
])
def test_gpu_aliases(catalog, alias, name):
    assert catalog.gpu(alias).name == name


def test_instance_names_ignore_case(catalog):
    assert catalog.instance("P4D.24XLARGE").name == "p4d.24xlarge"
    assert catalog.instance("standard_nd96asr_v4").name == "Standard_ND96asr_v4"


def test_unknown_names_come_with_the_nearest_valid_ones(catalog):
    with pytest.raises(UnknownNameError) as exc:
        catalog.gpu("a100-90gb")
    assert exc.value.suggestions[0] in ("a100-80gb", "a100-40gb")
    assert exc.value.exit_code == 2 and "a100-80gb" in str(exc.value)
    with pytest.raises(UnknownNameError) as exc:
        catalog.instance("p4d.48xlarge")
    assert "p4d.24xlarge" in exc.value.suggestions


def test_a_price_is_looked_up_in_the_region_asked_for(catalog):
    p4d = catalog.instance("p4d.24xlarge")
    assert p4d.price_for("on-demand", "us-east-1") is p4d.price_for("on-demand")
    assert p4d.price_for("on-demand", "eu-west-1") is None  # not in the snapshot: no price, not another region's


def test_multi_node_on_an_instance_with_unknown_network_asks_for_it(catalog):
    job = JobSpec(model="llama-2-7b", instance="gpu_8x_h100_sxm5", gpus=16)  # a single Lambda VM: no fabric known
    with pytest.raises(UsageError, match="--inter-node-gbps"):
        resolve(job, catalog)
    assert resolve(job.model_copy(update={"inter_node_gbps": 100}), catalog).nodes == 2


def test_suspect_prices_are_flagged_with_the_reason_in_estimates(catalog):
    est = estimate_setup(resolve(JobSpec(model="llama-2-7b", instance="a2-ultragpu-8g", tokens=1e9), catalog))
    assert est.cost.pricing.suspect
    warning = next(w for w in est.warnings if "marked suspect" in w)
    assert "on-demand price (14.77) is below its spot price" in warning


# ------------------------------------------------------------------ a user's catalog file

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
    builtin = load_catalog().instance("p4d.24xlarge")
    cat = load_catalog(f)
    p4d = cat.instance("p4d.24xlarge")
    assert p4d.price_for("on-demand", "us-east-1").usd_per_hour == 15.5
    # prices not given are kept (the suspect note names the new on-demand price it is compared with)
    assert p4d.price_for("spot").model_dump(exclude={"note"}) == builtin.price_for("spot").model_dump(exclude={"note"})
    assert p4d.vcpus == builtin.vcpus and p4d.network_gbps == builtin.network_gbps  # so are other fields
    onprem = cat.instance("onprem-8xa100")
    assert onprem.gpu == "a100-80gb"  # given by an alias, stored by its canonical name
    assert onprem.expected_nvlink[0][1:] == [12] * 7
    assert load_catalog().instance("p4d.24xlarge").price_for("on-demand").usd_per_hour != 15.5  # builtin untouched


def test_user_suspect_price_without_a_note_warns_in_words(tmp_path, catalog):
    f = tmp_path / "mine.toml"
    f.write_text('[[instance]]\nname = "p4d.24xlarge"\n[[instance.price]]\nregion = "us-east-1"\n'
                 'model = "on-demand"\nusd_per_hour = 15.5\nsuspect = true\n')
    cat = load_catalog(f)
    est = estimate_setup(resolve(JobSpec(model="llama-2-7b", instance="p4d.24xlarge", tokens=1e9), cat))
    assert "on-demand price of p4d.24xlarge is marked suspect: verify it before buying" in est.warnings
    assert not any("None" in w for w in est.warnings + est.assumptions)


@pytest.mark.parametrize("text,where,words", [
    ('[[instance]]\nname = "x"\ncloud = "onprem"\ngpu = "a100-80gb"\ngpu_count = "eight"\ntopology = "nvswitch"\n',
     5, "field 'instance.gpu_count'"),
    ('[[instance]]\nname = "p4d.24xlarge"\nnetwrok_gbps = 400\n', 3, "netwrok_gbps"),
    ('[[gpu]]\nname = "a100-80gb"\nmemory_gib = inf\n', 3, "field 'gpu.memory_gib': Input should be a finite number"),
    ('[[instance]]\nname = "p4d.24xlarge"\n[[instance.price]]\nregion = "us-east-1"\nmodel = "on-demand"\n'
     'usd_per_hour = nan\n', 6, "usd_per_hour"),
    ("gpu = 3\n", 1, "'gpu' must be written as [[gpu]] tables, one per entry (found the number 3)"),
    ('[gpu]\nname = "x"\n', 1, "'gpu' must be written as [[gpu]] tables, one per entry (found a single table)"),
    ('instance = ["x"]\n', 1, "(found an array holding a string)"),
    ('[[instance]]\nname = "p4d.24xlarge"\nprice = 3\n', 3, "'price' must be written as [[instance.price]] tables"),
    ('[[instance]]\nname = "p4d.24xlarge"\nprice = [3]\n', 3, "'price' must be written as [[instance.price]] tables"),
    ('[[gpu]]\nname = [1]\n', 2, "field 'gpu.name': Input should be a valid string"),
    ('[[instance]]\nname = {a = 1}\n', 2, "field 'instance.name': Input should be a valid string"),
    ('[[instance]]\nname = "onprem"\ncloud = "dc"\ngpu = "a100-90gb"\ngpu_count = 8\ntopology = "nvswitch"\n',
     4, "unknown GPU 'a100-90gb'"),
])
def test_user_catalog_errors_name_file_line_and_key(tmp_path, text, where, words):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert exc.value.exit_code == 2
    assert f"{f}:{where}" in str(exc.value) and words in str(exc.value)


@pytest.mark.parametrize("content,words", [
    (b"", "no [[gpu]] or [[instance]] tables: nothing to merge"),
    (b'schema_version = "1"\n[[gpu]]\n', "schema_version '1' is not supported; this trainready reads schema_version = 1"),
    (b"[[instance]\nname = ", "not valid TOML: "),  # then tomllib's words, which vary by Python version
    (b"a = " + b"[" * 5000 + b"]" * 5000, "not valid TOML: nested too deeply"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "is not a text file (byte 0 is not UTF-8)"),
    (b"name = \"caf\xe9\"\n", "is not a text file (byte 11 is not UTF-8)"),
])
def test_a_file_that_is_not_a_catalog_is_refused_naming_it(tmp_path, content, words):
    f = tmp_path / "mine.toml"
    f.write_bytes(content)
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert str(f) in str(exc.value) and words in str(exc.value)


def test_a_catalog_with_a_bom_reads_like_one_without(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_bytes(b'\xef\xbb\xbf[[instance]]\nname = "p4d.24xlarge"\nvcpus = 95\n')
    assert load_catalog(f).instance("p4d.24xlarge").vcpus == 95


def test_a_directory_or_a_missing_file_is_not_a_catalog(tmp_path):
    with pytest.raises(UsageError, match=f"cannot read catalog file {tmp_path}: it is a directory, not a file"):
        load_catalog(tmp_path)
    with pytest.raises(UsageError, match="cannot read catalog file .*nope.toml: No such file or directory"):
        load_catalog(tmp_path / "nope.toml")


# ------------------------------------------------------------------ regions, bounds, names (issue 12)

def test_a_mistyped_region_is_an_error_with_the_nearest_regions(catalog):
    with pytest.raises(UsageError) as exc:
        catalog.region("us-est-1")
    assert exc.value.exit_code == 2
    assert str(exc.value).startswith("unknown region 'us-est-1'. Did you mean: ")
    assert "us-east-1" in str(exc.value).split("?")[0]
    assert "The catalog has prices in: eastus, us-central1, us-east-1, us-east-2 " in str(exc.value)
    assert catalog.region("US-East-1") == "us-east-1"  # case and separators as for every name
    assert catalog.region("eu-west-1") == "eu-west-1"  # known: instances are offered there


def test_a_region_for_one_instance_must_have_its_price(catalog):
    p4d = catalog.instance("p4d.24xlarge")
    assert catalog.region("us-east-1", p4d, need_price=True) == "us-east-1"
    with pytest.raises(UsageError, match=r"^unknown region 'us-est-1'. Did you mean: us-east-1\? "
                                         r"p4d.24xlarge has a price in: us-east-1.$"):
        catalog.region("us-est-1", p4d, need_price=True)
    with pytest.raises(UsageError, match=r"^p4d.24xlarge has no price in eu-west-1 in the catalog; it has one in: "
                                         r"us-east-1. Give one of those as --region, or your price as --usd-per-hour.$"):
        catalog.region("eu-west-1", p4d, need_price=True)


def test_estimate_checks_the_region_it_prices_in(catalog):
    with pytest.raises(UsageError, match="p4d.24xlarge has a price in: us-east-1"):
        resolve(JobSpec(model="llama-2-7b", instance="p4d.24xlarge", region="us-est-1"), catalog)
    with pytest.raises(UsageError, match="^unknown region 'us-est-1'"):  # no instance: known to the catalog at all
        resolve(JobSpec(model="llama-2-7b", gpu="h100", region="us-est-1"), catalog)
    # with your own price, any region the catalog knows will do
    s = resolve(JobSpec(model="llama-2-7b", instance="p4d.24xlarge", region="EU-WEST-1", usd_per_hour=30.0), catalog)
    assert s.region == "eu-west-1"
    est = estimate_setup(resolve(JobSpec(model="llama-2-7b", instance="p4d.24xlarge", region="US-EAST-1",
                                         tokens=1e9), catalog))
    assert est.cost.pricing.region == "us-east-1" and est.cost.total_usd > 0


def test_an_instance_without_a_price_says_so_in_the_estimate(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[[instance]]\nname = "onprem"\ncloud = "dc"\ngpu = "h100"\ngpu_count = 8\ntopology = "nvswitch"\n')
    est = estimate_setup(resolve(JobSpec(model="llama-2-7b", instance="onprem", tokens=1e9), load_catalog(f)))
    assert est.cost.total_usd is None
    assert "no on-demand price for onprem in the catalog; give --usd-per-hour" in est.warnings


@pytest.mark.parametrize("text,where,words", [
    ('[[instance]]\nname = "p4d.24xlarge"\n[[instance.price]]\nregion = "us-east-1"\nmodel = "on-demand"\n'
     'usd_per_hour = 1e300\n', 6, "field 'instance.price.usd_per_hour': Input should be less than or equal to 10000"),
    ('[[instance]]\nname = "p4d.24xlarge"\ngpu_count = true\n', 3, "field 'instance.gpu_count': Input should be a valid integer"),
    ('[[instance]]\nname = "p4d.24xlarge"\ngpu_count = 100000\n', 3,
     "field 'instance.gpu_count': Input should be less than or equal to 1024"),
    ('[[instance]]\nname = "evil\\u001b[2J"\ncloud = "dc"\ngpu = "h100"\ngpu_count = 8\ntopology = "nvswitch"\n', 2,
     "field 'instance.name': Value error, 'evil\\x1b[2J' holds a control character: names are plain text"),
    ('[[gpu]]\nname = "h100-80gb"\naliases = ["x\\u202ey"]\n', 3,
     "field 'gpu.aliases': Value error, 'x\\u202ey' holds a control character"),
])
def test_user_catalog_values_out_of_bounds_name_file_line_and_key(tmp_path, text, where, words):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_catalog(f)
    assert f"{f}:{where}: {words}" in str(exc.value)
    assert "\x1b" not in str(exc.value) and "\u202e" not in str(exc.value)
