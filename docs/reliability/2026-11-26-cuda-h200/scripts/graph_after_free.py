"""Issue 34 on a real GPU: a graph launched after its memory was freed, beside another tenant."""
import sys
import anyio
import hipr
from hipr.backends import load_backend
from hipr.errors import HipError
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

SIZE = 64 << 20

async def main() -> None:
    backend = load_backend("cuda")
    async with running_worker(WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]) as w:
        url = w.bound_urls[0]
        async with hipr.aconnect(url) as alice, hipr.aconnect(url) as bob:
            a = await alice.malloc(SIZE)
            graph = await alice.graph_create()
            await graph.add_memset(a, 7, SIZE)
            exe = await graph.instantiate()
            await alice.free(a)
            b = await bob.malloc(SIZE)
            print(f"alice's freed buffer {int(a):#x}, bob's new buffer {int(b):#x}"
                  f"{' (the same address)' if int(a) == int(b) else ''}")
            await bob.memset(b, 1, SIZE)
            await exe.launch()
            try:
                await alice.synchronize()
                print("alice: graph launch after free: synchronize OK")
            except HipError as exc:
                print(f"alice: synchronize failed: {exc}")
            try:
                data = await bob.memcpy_dtoh(b, SIZE)
                print(f"bob reads back {'his own bytes (1)' if data == bytes([1]) * SIZE else 'BYTES HE NEVER WROTE: ' + repr(set(data))}")
            except HipError as exc:
                print(f"bob: read failed: {exc}")
            for what, call in (("bob free", bob.free(b)), ("alice exec destroy", exe.destroy()), ("alice graph destroy", graph.destroy())):
                try:
                    await call
                except HipError as exc:
                    print(f"{what}: {exc}")
        await anyio.sleep(0.5)
        print("backend holds after both sessions ended:", backend.stats())

anyio.run(main)
