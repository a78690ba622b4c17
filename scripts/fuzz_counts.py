"""Counts of a schemathesis NDJSON report: requests sent, 5xx answers, schema violations (a failed
status-code, content-type or response-schema check), and tracebacks in the server's log.

    python scripts/fuzz_counts.py events.ndjson [server.log]
"""

from __future__ import annotations

import collections
import json
import sys

SCHEMA_CHECKS = ("status_code_conformance", "content_type_conformance",
                 "response_schema_conformance")


def counts(events_path: str) -> dict[str, int]:
    out = {"requests": 0, "5xx": 0, "schema_violations": 0}
    statuses: collections.Counter[int] = collections.Counter()
    for line in open(events_path):
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if finished is None:
            continue
        recorder = finished["recorder"]
        for interaction in recorder.get("interactions", {}).values():
            response = interaction.get("response")
            out["requests"] += 1
            if response is not None:
                statuses[response["status_code"]] += 1
                out["5xx"] += response["status_code"] >= 500
        for checks in recorder.get("checks", {}).values():
            out["schema_violations"] += sum(c["name"] in SCHEMA_CHECKS and c["status"] == "failure"
                                            for c in checks)
    out.update({f"status_{code}": n for code, n in sorted(statuses.items())})
    return out


if __name__ == "__main__":
    result = counts(sys.argv[1])
    if len(sys.argv) > 2:
        result["server_tracebacks"] = open(sys.argv[2]).read().count("Traceback")
    print(json.dumps(result))
