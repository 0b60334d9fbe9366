"""How long do `account` and `plan --live` take over 4 regions, and what share of `plan --live` is the search?

Against moto's standalone server on 127.0.0.1 (started here, stopped at the end): moto answers STS, EC2
offerings and instance types, dry runs, spot history, SSM, budgets; the calls it lacks (Service Quotas for
EC2, spot placement scores, Capacity Blocks, reservations, the Price List) come back as its HTTP 500 and
make `unknown` lines, as a real endpoint that refuses them would. AWS_MAX_ATTEMPTS=1 so those 500s are not
retried with botocore's back-off (which would time the back-off, not trainready). In-process (no Python
start-up), medians of 3 runs:

- account, cold: nothing cached (every answer asked), regions concurrently, and the same with one worker
  (regions one after another) to show what concurrency buys;
- account, warm: the second run within --max-age (answers from the disk cache);
- plan --live: the search (plan.search.plan) and the live part (cloud.live.annotate), cold cache.

moto's own first DescribeInstanceTypes loads every instance type (~2 s, server side): it is done once
before timing, as a long-running endpoint would have it loaded. A local server answers in about a
millisecond, so the figures are CPU (botocore and moto on the same cores); the same runs are repeated with
LATENCY_MS added to every request (a botocore before-send hook that sleeps), the order of a round trip to
a region on another continent, where asking regions concurrently and the cache matter.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # moto's server wrapper (tests/s3server.py)

REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1")
RUNS = 3
LATENCY_MS = 80  # an assumption for the second set of figures, not a measurement


def _env(url: str, cache: str) -> None:
    for key in list(os.environ):
        if key.startswith(("AWS_", "TRAINREADY_")):
            del os.environ[key]
    os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
                       "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                       "TRAINREADY_CACHE_DIR": cache})


def _median(times: list[float]) -> str:
    return f"median {statistics.median(times):5.2f} s (best {min(times):.2f}, worst {max(times):.2f})"


def main() -> None:
    import boto3
    from s3server import MotoServer

    from trainready.catalog import load_catalog
    from trainready.cloud import account as acct
    from trainready.cloud import aws
    from trainready.cloud.account import Ask, check_account
    from trainready.cloud.aws import AwsProvider
    from trainready.cloud.cache import Cache
    from trainready.cloud.live import LiveRequest, annotate
    from trainready.plan.job import JobSpec
    from trainready.plan.search import PlanRequest, plan

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    server = MotoServer()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _env(server.url, tmp)
            boto3.client("ec2", region_name="us-east-1").describe_instance_types(InstanceTypes=["p5.48xlarge"])
            catalog = load_catalog()
            ask = Ask(instance=catalog.instance("p5.48xlarge"), nodes=2, spot=False, hours=72.0, regions=REGIONS)
            print(f"moto server at {server.url}; {len(REGIONS)} regions: {', '.join(REGIONS)}; {cores} core(s)")

            def account(max_age: float, workers: int | None = None) -> tuple[float, object]:
                if workers is not None:
                    acct.MAX_WORKERS = workers
                t0 = time.perf_counter()
                report = check_account(AwsProvider(Cache(max_age_s=max_age)), ask)
                return time.perf_counter() - t0, report

            def figures(label: str, cache_dir: str) -> None:
                os.environ["TRAINREADY_CACHE_DIR"] = cache_dir
                cold = [account(0)[0] for _ in range(RUNS)]
                serial = [account(0, workers=1)[0] for _ in range(RUNS)]
                acct.MAX_WORKERS = 16
                account(3600)  # fill the cache
                warm_runs = [account(3600) for _ in range(RUNS)]
                hits = warm_runs[-1][1].cache.hits
                print(f"{label}")
                print(f"  account p5.48xlarge x2, cold cache, regions concurrently: {_median(cold)}")
                print(f"  account p5.48xlarge x2, cold cache, one region at a time: {_median(serial)}")
                print(f"  account p5.48xlarge x2, warm cache ({hits} answers from disk): "
                      f"{_median([t for t, _ in warm_runs])}")
                job = JobSpec(model="llama-2-13b", method="full", tokens=2e9)
                search, live, rows = [], [], 0
                for _ in range(RUNS):
                    t0 = time.perf_counter()
                    result = plan(PlanRequest(job=job, clouds=["aws"]), catalog)
                    t1 = time.perf_counter()
                    result = annotate(result, catalog, LiveRequest(regions=REGIONS, max_age_s=0))
                    t2 = time.perf_counter()
                    search.append(t1 - t0)
                    live.append(t2 - t1)
                    rows = len(result.rows)
                total = [a + b for a, b in zip(search, live, strict=True)]
                share = statistics.median(search) / statistics.median(total)
                print(f"  plan --live llama-2-13b (aws, {rows} rows x {len(REGIONS)} regions): {_median(total)}")
                print(f"    the search itself: {_median(search)} = {share:.0%} of it; live part: {_median(live)}")

            check_account(AwsProvider(Cache(max_age_s=0)), ask)  # client and model loading, once
            figures("local server as it is:", tmp + "/a")
            real = aws.new_client

            def slow_client(session, service, region):
                client = real(session, service, region)
                client.meta.events.register("before-send.*.*", lambda **kw: time.sleep(LATENCY_MS / 1000))
                return client

            aws.new_client = slow_client
            figures(f"with {LATENCY_MS} ms added to every request:", tmp + "/b")
            aws.new_client = real
    finally:
        server.stop()


if __name__ == "__main__":
    main()
