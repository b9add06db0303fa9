"""One leader-election candidate whose work is an effect every 0.3 s, for the Kubernetes tests
and demo: `python -m detector.demos.kube_candidate --kubeconfig F --namespace NS --lease NAME
--identity ID --topic T` (Kafka from the `SPLITBRAIN_*` environment).

Each effect is printed (`effect <n> epoch=<e>`) as it is reported; "stopped leading" is printed
when the elector gives up. Paused (SIGSTOP) past its lease, the leader is the zombie: its work
goes on until the elector notices, and `LeaderElector` stops it then.
"""

from __future__ import annotations

import argparse
import threading

from kubernetes import config

from detector.adapters import AdapterSink, current, effect_committed
from detector.adapters.kubernetes import LeaderElector
from detector.kafka.emit import Emitter


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--kubeconfig", "--namespace", "--lease", "--identity", "--topic"):
        p.add_argument(flag, required=True)
    p.add_argument("--lease-duration", type=int, default=4)
    args = p.parse_args()
    config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    sink = AdapterSink(
        "kubernetes",
        publisher=lambda: Emitter.from_env(topic=args.topic),
    )

    def work(stop: threading.Event) -> None:
        owner = current()
        epoch = owner.owner_epoch if owner is not None else None
        n = 0
        while True:
            n += 1
            effect_committed(f"{args.identity}/report/{n}", destination="reports")
            print(f"effect {n} epoch={epoch}", flush=True)
            stop.wait(0.3)

    elector = LeaderElector(
        args.lease,
        args.namespace,
        args.identity,
        work,
        sink,
        lease_duration=args.lease_duration,
        renew_deadline=args.lease_duration - 1,
        retry_period=1,
        on_stopped=lambda: print("stopped leading", flush=True),
    )
    elector.run()
    sink.close(10)


if __name__ == "__main__":
    main()
