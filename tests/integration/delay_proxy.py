#!/usr/bin/env python3
"""delay_proxy.py LISTEN_PORT TARGET_HOST:PORT DELAY_MS

A TCP proxy on 127.0.0.1:LISTEN_PORT that forwards every connection to
TARGET and delays each chunk it reads, in either direction, by DELAY_MS
before writing it on (a slow network or a slow store: latency, not a
bandwidth limit; order is kept). Prints "listening" once it accepts.
Used by etcd_degraded.sh to slow etcd down.
"""
import asyncio
import sys


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read_side():
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay, data))
            if not data:
                return

    async def write_side():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(read_side(), write_side())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main():
    port = int(sys.argv[1])
    host, tport = sys.argv[2].rsplit(":", 1)
    delay = int(sys.argv[3]) / 1000.0

    async def serve(creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection(host, int(tport))
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(pump(creader, uwriter, delay),
                             pump(ureader, cwriter, delay))

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
