/**
 * Transports for the two Redis clients of npm: `redis` (node-redis v4 and
 * later, a client or a cluster) and `ioredis` (Redis or Cluster). Each
 * sends rl's commands with their keys declared, so a cluster client sends
 * each call to the node that owns its slot.
 */
import { RlCommands, type Transport } from "./commands.js";

/** The part of a node-redis client used here. */
export interface NodeRedisClient {
  sendCommand(args: string[]): Promise<unknown>;
}
/** The part of a node-redis cluster used here. */
export interface NodeRedisCluster {
  sendCommand(firstKey: string | undefined, isReadonly: boolean | undefined, args: string[]): Promise<unknown>;
}

function isNodeRedisCluster(c: object): c is NodeRedisCluster {
  // a cluster has its slot table and masters (v4, v5 and later)
  return "masters" in c && "slots" in c;
}

/** A transport over a node-redis client or cluster (`createClient` / `createCluster`). */
export function nodeRedisTransport(client: NodeRedisClient | NodeRedisCluster): Transport {
  // node-redis reads the arguments without changing them (and rl's commands never change them after sending)
  if (isNodeRedisCluster(client)) {
    return { send: (keys, args, readonly) => client.sendCommand(keys[0], readonly, args as string[]) };
  }
  const c = client as NodeRedisClient;
  return { send: (_keys, args) => c.sendCommand(args as string[]) };
}

/** The part of an ioredis client or cluster used here. */
export interface IoredisClient {
  sendCommand(command: unknown): unknown;
  /** `Redis.duplicate(override)`; a `Cluster`'s takes the startup nodes first. */
  duplicate(...args: unknown[]): IoredisClient;
  on(event: "close" | "end" | "error", listener: () => void): unknown;
  disconnect(): void;
  /** ioredis's connection state: "end" once it will not reconnect. */
  readonly status: string;
}

type SentCommand = { rlKeys: string[]; written: boolean; promise: Promise<unknown>; reject(err: Error): void };
type CommandClass = new (name: string, args: string[]) => SentCommand;
let commandClass: Promise<CommandClass> | undefined;

/**
 * ioredis's Command with the keys given, not looked up in ioredis's table
 * of known commands (which has no rl commands): its slot is the first
 * key's, so a Cluster sends it to the node that owns it. `written` says
 * whether it went out on a connection.
 */
function keyedCommand(): Promise<CommandClass> {
  commandClass ??= import("ioredis").then((m) => {
    const Command = (m as unknown as { Command: new (n: string, a: string[]) => { toWritable(s: object): unknown } }).Command;
    class KeyedCommand extends Command {
      rlKeys: string[] = [];
      written = false;
      getKeys(): string[] {
        return this.rlKeys;
      }
      override toWritable(socket: object): unknown {
        this.written = true;
        return super.toWritable(socket);
      }
    }
    return KeyedCommand as unknown as CommandClass;
  });
  return commandClass;
}

/** The error of a command whose connection closed after it was sent. */
export class RlConnectionClosedError extends Error {
  override name = "RlConnectionClosedError";
}

/**
 * The connection rl's charging commands go through: a duplicate of the
 * user's client that never sends a command twice. ioredis sends the
 * commands that were waiting for a reply again after it reconnects
 * (`autoResendUnfulfilledCommands`, default true), and a Cluster sends a
 * command again when its node's connection closes (`retryDelayOnFailover`);
 * the duplicate has both off (and its cluster nodes no reconnect strategy
 * of their own), and a command it had sent fails with
 * `RlConnectionClosedError` when its connection closes. The user's client
 * and its options are left as they are (but for the offline queue: the
 * duplicate queues what it has not written yet, which is safe to send
 * once); the duplicate connects at its first command, disconnects when the
 * user's client ends, and is opened again by the next command after it
 * ended. One per client (`atMostOnce`).
 */
const CLOSED = "the connection to Redis closed after the command was sent; rl does not send it again";

class AtMostOnce {
  private dup: IoredisClient | undefined;
  private readonly inFlight = new Set<SentCommand>();

  constructor(private readonly client: IoredisClient) {
    client.on("end", () => this.dup?.disconnect());
  }

  send(cmd: SentCommand): Promise<unknown> {
    if (this.dup === undefined || this.dup.status === "end") this.dup = this.open();
    const dup = this.dup;
    this.inFlight.add(cmd);
    const done = () => this.inFlight.delete(cmd);
    cmd.promise.then(done, done);
    dup.sendCommand(cmd);
    // ioredis fails what a connection that will not reconnect had sent with its own "Connection is closed."
    return cmd.promise.catch((e: Error) => {
      if (cmd.written && !(e instanceof RlConnectionClosedError) && /Connection is closed/.test(e.message)) {
        throw new RlConnectionClosedError(CLOSED);
      }
      throw e;
    });
  }

  private open(): IoredisClient {
    const cluster = typeof (this.client as { nodes?: unknown }).nodes === "function";
    const dup = cluster
      ? this.client.duplicate([], {
          lazyConnect: true, enableOfflineQueue: true, retryDelayOnFailover: 0, clusterNodeRetryStrategy: null,
          clusterRetryStrategy: () => null,
        })
      : this.client.duplicate({
          lazyConnect: true, enableOfflineQueue: true, autoResendUnfulfilledCommands: false, retryStrategy: () => null,
        });
    // it never reconnects by itself (a closed one ends; the next command opens another), and its
    // errors reach the commands that failed
    dup.on("error", () => {});
    // a closed connection's replies never come (not resent): fail what it had sent
    dup.on("close", () => {
      for (const cmd of this.inFlight) {
        if (cmd.written) cmd.reject(new RlConnectionClosedError(CLOSED));
      }
    });
    return dup;
  }
}

const AT_MOST_ONCE = new WeakMap<IoredisClient, AtMostOnce>();

/** The one `AtMostOnce` of `client` (one duplicate connection however many transports use it). */
function atMostOnce(client: IoredisClient): AtMostOnce {
  let once = AT_MOST_ONCE.get(client);
  if (once === undefined) {
    once = new AtMostOnce(client);
    AT_MOST_ONCE.set(client, once);
  }
  return once;
}

/**
 * A transport over an ioredis `Redis` or `Cluster`: read-only commands go
 * through the client itself, the others at most once (see `AtMostOnce`).
 */
export function ioredisTransport(client: IoredisClient): Transport {
  const once = atMostOnce(client);
  return {
    send: async (keys, args, readonly) => {
      const Command = await keyedCommand();
      const cmd = new Command(args[0]!, args.slice(1));
      cmd.rlKeys = [...keys];
      if (readonly) {
        await client.sendCommand(cmd);
        return cmd.promise;
      }
      return once.send(cmd);
    },
  };
}

/** rl's typed commands over a node-redis client or cluster. */
export function forRedis(client: NodeRedisClient | NodeRedisCluster): RlCommands {
  return new RlCommands(nodeRedisTransport(client));
}

/** rl's typed commands over an ioredis Redis or Cluster. */
export function forIoredis(client: IoredisClient): RlCommands {
  return new RlCommands(ioredisTransport(client));
}
