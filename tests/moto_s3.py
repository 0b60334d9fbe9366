"""moto's standalone S3 server, with one rule of real S3 that moto leaves out.

"Objects encrypted by SSE-C or SSE-KMS have ETags that are not an MD5 digest of their object
data" (Amazon S3 API Reference, Common Response Headers / ETag). moto returns the MD5 for every
object, so a client that predicts ETags passes against moto and fails against S3 on any bucket
with default KMS encryption. Here objects stored with aws:kms (or SSE-C) get an opaque ETag, as
on S3; everything else is moto as shipped. Run as `python tests/moto_s3.py -H HOST -p PORT`.
"""

import hashlib
import sys

from moto.s3 import models

_md5_etag = models.FakeKey.etag


def _etag(self: models.FakeKey) -> str:
    tag = _md5_etag.fget(self)
    if getattr(self, "encryption", None) in ("aws:kms", "aws:kms:dsse") or getattr(self, "sse_customer_algorithm", None):
        return '"' + hashlib.md5(b"opaque:" + tag.encode(), usedforsecurity=False).hexdigest() + '"'
    return tag


models.FakeKey.etag = property(_etag)

if __name__ == "__main__":
    from moto.server import main

    main(sys.argv[1:])
