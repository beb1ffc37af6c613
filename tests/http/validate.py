"""Validates real stockgate HTTP responses against deploy/openapi.yaml.

Reads JSON lines from stdin, each {"method", "path", "status", "body",
"headers"} (method "post" when absent),
resolves the documented response schema for that path and status, and
checks the body (and, for a 503, the Retry-After header) against it.
Prints one line per response and exits 1 if any does not conform.
"""

import json
import sys

import jsonschema_rs
import yaml


def resolve(node, root):
    """Inlines the spec's local $refs, so the schema stands alone."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = root
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return resolve(target, root)
        return {k: resolve(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, root) for v in node]
    return node


def main():
    spec = yaml.safe_load(open(sys.argv[1]))
    failures = 0
    for line in sys.stdin:
        case = json.loads(line)
        operation = spec["paths"][case["path"]][case.get("method", "post")]
        documented = operation["responses"].get(str(case["status"]))
        if documented is None:
            print(f"FAIL {case['path']} {case['status']}: status not documented")
            failures += 1
            continue
        documented = resolve(documented, spec)
        schema = documented["content"]["application/json"]["schema"]
        errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(case["body"])]
        if "Retry-After" in documented.get("headers", {}) and "retry-after" not in case["headers"]:
            errors.append("Retry-After header missing")
        if errors:
            print(f"FAIL {case['path']} {case['status']} {case['body']}: {errors}")
            failures += 1
        else:
            print(f"ok   {case['path']} {case['status']}")
    sys.exit(1 if failures else 0)


main()
