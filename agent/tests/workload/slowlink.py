#!/usr/bin/env python3
"""A slow link in front of a server: accepts TCP connections on a free
loopback port and forwards each to TARGET (host:port), passing the client's
bytes at most RATE bytes a second (the answers unthrottled). Prints
"listening PORT", then, per connection when it closes, "connection up=BYTES
seconds=S"."""
import asyncio
import sys
import time


async def pump(reader, writer, rate, counted):
    start = time.monotonic()
    sent = 0
    try:
        while True:
            data = await reader.read(8192)
            if not data:
                break
            sent += len(data)
            if rate:
                due = start + sent / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass
    if counted:
        print(f"connection up={sent} seconds={time.monotonic() - start:.3f}", flush=True)


async def main():
    host, port = sys.argv[1].rsplit(":", 1)
    rate = float(sys.argv[2])

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pump(client_reader, server_writer, rate, True),
            pump(server_reader, client_writer, 0, False),
        )

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
