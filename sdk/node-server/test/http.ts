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

/** rl's boundary offset of a window key (FNV-1a 64, then fmix64, scaled to the window). */
export function keyOffsetMs(key: string, windowMs: number): number {
  const mask = (1n << 64n) - 1n;
  let h = 0xcbf29ce484222325n;
  for (const b of Buffer.from(key)) h = ((h ^ BigInt(b)) * 0x100000001b3n) & mask;
  h ^= h >> 33n;
  h = (h * 0xff51afd7ed558ccdn) & mask;
  h ^= h >> 33n;
  h = (h * 0xc4ceb9fe1a85ec53n) & mask;
  h ^= h >> 33n;
  return Number((h * BigInt(windowMs)) >> 64n);
}

/**
 * Waits past the next window boundary of any of `keys` when one is less than
 * `marginMs` away, so that a burst of calls falls in one window; true when it waited.
 */
export async function avoidBoundary(keys: string[], windowMs: number, marginMs = 10_000): Promise<boolean> {
  let waited = false;
  for (let i = 0; i < 4; i++) {
    const now = Date.now();
    const left = Math.min(...keys.map((k) => windowMs - ((now - keyOffsetMs(k, windowMs)) % windowMs)));
    if (left >= marginMs) return waited;
    await new Promise((r) => setTimeout(r, left + 300));
    waited = true;
  }
  return waited;
}
