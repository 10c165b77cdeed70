#!/usr/bin/env python3
"""A TCP proxy on loopback that holds back the start of every HTTP answer by a fixed delay: a store
with a round trip per request, in front of a local S3 server that has none. For benchmarks only.

    scripts/slow-proxy.py LISTEN_PORT UPSTREAM_HOST:PORT DELAY_MS
"""
import asyncio
import sys


async def pipe(reader, writer, delay_s):
    try:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            if delay_s and chunk.startswith(b"HTTP/"):
                await asyncio.sleep(delay_s)
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main():
    port, upstream, delay_ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    host, up_port = upstream.rsplit(":", 1)

    async def handle(client_r, client_w):
        server_r, server_w = await asyncio.open_connection(host, int(up_port))
        await asyncio.gather(pipe(client_r, server_w, 0), pipe(server_r, client_w, delay_ms / 1000))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


asyncio.run(main())
