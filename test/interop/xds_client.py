"""xds_client.py: an independent xDS judge on gRPC C-core (Debian's
python3-grpcio). It resolves xds:///<model> with C-core's own xDS client
against the bootstrap in GRPC_XDS_BOOTSTRAP_CONFIG and calls the interop
backends' raw unary method /isobar.interop.Who/Name in a loop.

Usage: python3 xds_client.py <target> <max_rpcs> <max_seconds>

Output: the same JSON lines as xds_client.js.
"""
import json
import sys
import time

import grpc


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: python3 xds_client.py <target> <max_rpcs> <max_seconds>\n")
        return 2
    target, max_rpcs, max_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    end = time.time() + max_seconds
    ok = failed = 0
    out = sys.stdout

    def line(o):
        out.write(json.dumps(o) + "\n")
        out.flush()

    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/isobar.interop.Who/Name")  # raw bytes in and out
        while ok + failed < max_rpcs and time.time() < end:
            try:
                reply = call(b"", timeout=2)
                ok += 1
                line({"ms": int(time.time() * 1000), "backend": reply.decode()})
            except grpc.RpcError as e:
                failed += 1
                line({"ms": int(time.time() * 1000), "error": "%s: %s" % (e.code().name, e.details())})
                time.sleep(0.02)  # a failing channel answers at once; pace the retries
    line({"done": True, "ok": ok, "failed": failed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
