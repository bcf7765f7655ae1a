#!/usr/bin/env python3
"""An independent implementation of docs/contract.md, checked against its vectors.

Written from the document alone, in another language, with Python's standard library:
its own RFC 8785 serializer for the v2 value domain, SHA-256, and the member list of
every preimage kind. `cargo xtask ci` runs it; it exits non-zero on any disagreement.

Usage: python3 scripts/check_contract_vectors.py [docs/contract-vectors.json]
"""

import hashlib
import json
import sys

# docs/contract.md, "Preimages": the exact members of each kind, and its domain.
KINDS = {
    "request": ("tool-result-v2/request", None,
                ["tenant_id", "subject_id", "tool_name", "arguments", "input_revision",
                 "output_revision", "effect_revision"]),
    "approval": ("tool-result-v2/approval", None,
                 ["approval_id", "approver_id", "tenant_id", "subject_id", "provider",
                  "api_family", "adapter_revision", "provider_response_id", "provider_call_id",
                  "operation_id", "idempotency_key", "tool_name", "request_sha256", "revisions",
                  "approved_at", "expires_at"]),
    "downstream_request_ref": ("tool-result-v2/downstream-request", "dr_",
                               ["tenant_id", "subject_id", "tool_name", "idempotency_key",
                                "request_sha256"]),
    "status_ref": ("tool-result-v2/status-ref", "sr_",
                   ["tenant_id", "subject_id", "tool_name", "idempotency_key"]),
    "refund_id": ("tool-result-v2/refund-id", "rf_", ["downstream_request_ref"]),
    "result": ("tool-result-v2/result", None, ["tool_name", "output_revision", "output"]),
    "downstream_receipt_ref": ("tool-result-v2/downstream-receipt", "rc_",
                               ["downstream_request_ref", "request_sha256", "tool_name",
                                "output_revision", "output"]),
    "call_binding": ("tool-result-v2/call-binding", None,
                     ["provider", "api_family", "adapter_revision", "provider_response_id",
                      "provider_call_id", "purpose", "operation_id", "idempotency_key",
                      "tool_name", "revisions", "request_sha256", "result_sha256",
                      "downstream_request_ref", "downstream_receipt_ref", "status_ref",
                      "delivery"]),
    "status_query_response": ("tool-result-v2/status-query", "qs_",
                              ["kind", "provider_response_id", "status_ref"]),
    "status_query_call": ("tool-result-v2/status-query", "qs_",
                          ["kind", "provider_call_id", "status_ref"]),
}
REVISIONS = ["input", "output", "effect", "handler", "producer", "policy"]
V2_MAX = 2**53 - 1


def canonical_string(text):
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20:
            short = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
            out.append(short.get(code, "\\u%04x" % code))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical(value):
    """RFC 8785 for the v2 domain: no floats; names sorted by UTF-16 code units."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if not -V2_MAX <= value <= V2_MAX:
            raise ValueError("integer outside the v2 domain")
        return str(value)
    if isinstance(value, float):
        raise ValueError("fractions are outside the v2 domain")
    if isinstance(value, str):
        return canonical_string(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical(item) for item in value) + "]"
    if isinstance(value, dict):
        names = sorted(value, key=lambda name: name.encode("utf-16-be"))
        return "{" + ",".join(canonical_string(n) + ":" + canonical(value[n]) for n in names) + "}"
    raise ValueError("not JSON")


def refuse_duplicates(pairs):
    names = [name for name, _ in pairs]
    if len(names) != len(set(names)):
        raise ValueError("duplicate member name")
    return dict(pairs)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/contract-vectors.json"
    with open(path, "rb") as handle:
        vectors = json.loads(handle.read().decode("utf-8"), object_pairs_hook=refuse_duplicates)
    failures = 0
    seen_kinds = set()
    for vector in vectors:
        name, kind, preimage = vector["name"], vector["kind"], vector["preimage"]
        domain, prefix, members = KINDS[kind]
        seen_kinds.add(kind)
        problems = []
        if sorted(preimage) != sorted(["domain"] + members):
            problems.append("members differ from docs/contract.md")
        if preimage.get("domain") != domain:
            problems.append("wrong domain")
        if "revisions" in preimage and sorted(preimage["revisions"]) != sorted(REVISIONS):
            problems.append("revisions members differ")
        digest = hashlib.sha256(canonical(preimage).encode("utf-8")).hexdigest()
        if digest != vector["sha256"]:
            problems.append("sha256 differs: computed " + digest)
        expected_value = prefix + digest[:32] if prefix else None
        if vector["value"] != expected_value:
            problems.append("value differs: computed %r" % expected_value)
        if problems:
            failures += 1
            print("FAIL %s (%s): %s" % (name, kind, "; ".join(problems)))
    missing = set(KINDS) - seen_kinds - {"refund_id"}
    if missing:
        failures += 1
        print("FAIL no vector of kinds: " + ", ".join(sorted(missing)))
    print("%d passed, %d failed" % (len(vectors) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
