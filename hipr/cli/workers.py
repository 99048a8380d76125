"""``hipr workers``: the URL list of a fleet of workers, for a multi-worker client.

``hipr workers --kubernetes hipr-worker.gpu`` resolves the headless Service
``hipr-worker`` of namespace ``gpu`` (``hipr-worker.gpu.svc.cluster.local``): its DNS
name has one A/AAAA record per ready worker pod. The addresses are sorted, so every
client sees the same device numbering, and printed comma-separated, as ``HIPR_URL`` and
``hipr.connect`` take them::

    export HIPR_URL=$(hipr workers --kubernetes hipr-worker.gpu)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
from pathlib import Path

from hipr.cli.common import EXIT_OK
from hipr.errors import HipConnectionError
from hipr.worker.config import ConfigError

DEFAULT_PORT = 18515
#: Where a pod finds its own namespace (the service account's mount).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def service_dns_name(service: str, namespace: str | None, cluster_domain: str) -> str:
    """The DNS name of a Service: ``NAME.NAMESPACE.svc.DOMAIN``.

    ``service`` is ``NAME`` or ``NAME.NAMESPACE`` (as ``kubectl`` users write it), or an
    already full name ending in ``.svc`` or ``.svc.DOMAIN``, used as it is. Without a
    namespace: ``namespace``, then the pod's own namespace, then ``default``.
    """
    name = service.strip().rstrip(".")
    if not name or any(not part for part in name.split(".")):
        raise ConfigError(f"not a Service name: {service!r}", source="--kubernetes")
    parts = name.split(".")
    if "svc" in parts:
        return name if parts[-1] != "svc" else f"{name}.{cluster_domain}"
    if len(parts) > 2:
        raise ConfigError(
            f"expected SERVICE or SERVICE.NAMESPACE, got {service!r}", source="--kubernetes"
        )
    if len(parts) == 2:
        service_name, ns = parts
    else:
        service_name, ns = parts[0], namespace or _pod_namespace() or "default"
    return f"{service_name}.{ns}.svc.{cluster_domain}"


def _pod_namespace() -> str | None:
    try:
        return POD_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


def resolve_urls(host: str, port: int, scheme: str = "tcp") -> list[str]:
    """One URL per address of ``host`` (A and AAAA records), sorted: IPv4 first, then
    IPv6, each in numeric order, so the list is the same on every client."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HipConnectionError(message=f"cannot resolve {host}: {exc.strerror}") from None
    addresses = {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}
    if not addresses:
        raise HipConnectionError(message=f"{host} has no addresses: no worker is ready")
    ordered = sorted(addresses, key=lambda a: (a.version, int(a)))
    return [
        f"{scheme}://[{a}]:{port}" if a.version == 6 else f"{scheme}://{a}:{port}" for a in ordered
    ]


def add_workers_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hipr workers`` to the CLI's subcommands."""
    w = sub.add_parser(
        "workers",
        help="list the worker URLs of a fleet (Kubernetes headless Service, DNS)",
        description="Print the URLs of the workers behind a Kubernetes headless Service "
        "(or any DNS name with one address per worker), comma-separated for HIPR_URL and "
        "hipr.connect: export HIPR_URL=$(hipr workers --kubernetes hipr-worker.gpu).",
    )
    source = w.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--kubernetes",
        metavar="SERVICE[.NAMESPACE]",
        help="a headless Service; namespace default: the pod's own, else 'default'",
    )
    source.add_argument("--dns", metavar="HOST", help="any DNS name with one record per worker")
    w.add_argument("--namespace", help="the Service's namespace (instead of SERVICE.NAMESPACE)")
    w.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the cluster's DNS domain (default cluster.local)",
    )
    w.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"worker port (default {DEFAULT_PORT})"
    )
    w.add_argument(
        "--scheme", default="tcp", choices=("tcp", "tls"), help="URL scheme (default tcp)"
    )
    out = w.add_mutually_exclusive_group()
    out.add_argument("--lines", action="store_true", help="one URL a line instead of commas")
    out.add_argument("--json", action="store_true", help="print a JSON list")
    w.set_defaults(func=cmd_workers, client=True)


def cmd_workers(args: argparse.Namespace) -> int:
    """``hipr workers --kubernetes SERVICE``: the workers' URLs."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"port must be 1..65535, got {args.port}", source="--port")
    if args.kubernetes is not None:
        host = service_dns_name(args.kubernetes, args.namespace, args.cluster_domain)
    else:
        host = args.dns
    urls = resolve_urls(host, args.port, args.scheme)
    if args.json:
        print(json.dumps(urls))
    elif args.lines:
        print("\n".join(urls))
    else:
        print(",".join(urls))
    return EXIT_OK
