"""The evidence cache: partitions, verified semantic hits, ACL decisions, principals, stores, versions, audit.

Pure core: partition, verify, lexicon, lexical, acl, audit, entry. I/O shell: embedders (onnxruntime),
store_memory, store_redis (redis), principal (PyJWT, reads a JWKS file once), admin (starlette).
The pipeline stage that uses it is `ragtoll.proxy.stages.cache.EvidenceStage`.
"""
