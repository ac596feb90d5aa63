/** HTTP helpers for the framework tests: listening, concurrent clients. */
import { once } from "node:events";
import type { Server as HttpServer } from "node:http";

/** Starts `listen` on a free loopback port; the base URL. */
export async function listening(server: HttpServer): Promise<string> {
  if (!server.listening) await once(server, "listening");
  const { port } = server.address() as { port: number };
  return `http://127.0.0.1:${port}`;
}

/** `clients` clients at once, each sending `each` requests one after the other: the statuses. */
export async function hammer(url: string, clients: number, each: number, init?: RequestInit): Promise<number[]> {
  const statuses: number[] = [];
  await Promise.all(Array.from({ length: clients }, async () => {
    for (let i = 0; i < each; i++) {
      const r = await fetch(url, init);
      await r.arrayBuffer();
      statuses.push(r.status);
    }
  }));
  return statuses;
}

export const count = (xs: number[], x: number) => xs.filter((y) => y === x).length;

/** Polls `url` until it answers `want` (at most 100 tries, 100 ms apart): the last status. */
export async function untilStatus(url: string, want = 200): Promise<number> {
  let status = 0;
  for (let i = 0; i < 100 && status !== want; i++) {
    status = (await fetch(url)).status;
    if (status !== want) await new Promise((r) => setTimeout(r, 100));
  }
  return status;
}
