"""docs/security.md lists every AWS action the tool can call (issue 26: what leaves the machine, and where).
A call added to cloud/aws.py without its line in that page fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_aws_action_is_in_the_security_page():
    source = (ROOT / "src/trainready/cloud/aws.py").read_text()
    actions = set(re.findall(r'"(?:sts|ec2|servicequotas|cloudwatch|ssm|pricing|budgets|s3):([A-Z][A-Za-z]+)"', source))
    assert {"GetCallerIdentity", "RunInstances", "GetProducts", "RequestServiceQuotaIncrease"} <= actions
    page = (ROOT / "docs/security.md").read_text()
    missing = sorted(a for a in actions if a not in page)
    # budgets:ModifyBudget is the IAM name of CreateBudget, which the page names
    assert missing == ["ModifyBudget"] and "CreateBudget" in page, missing


def test_the_security_page_is_linked_from_the_docs_index():
    assert "(security.md)" in (ROOT / "docs/README.md").read_text()
