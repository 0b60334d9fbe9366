"""Live facts from cloud accounts: quotas, offerings, permissions, prices, capacity.

A provider is one module here (aws.py); the catalog (trainready.catalog) stays apart from it, as
SkyPilot keeps its catalog apart from its provisioners. GCP and Azure have no provider yet: their
rows keep the catalog's prices and say so. Nothing here is imported by `trainready.plan`; the CLI
calls `cloud.live` on a plan's result. boto3 is optional (the `s3` extra): without it every live
check says so in one line and the catalog answers.
"""

PROVIDERS = {"aws": "trainready.cloud.aws"}
OFFLINE = {"gcp": "GCP", "azure": "Azure", "lambda": "Lambda"}
