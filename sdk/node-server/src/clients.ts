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
}

type CommandClass = new (name: string, args: string[]) => { promise: Promise<unknown> };
let commandClass: Promise<CommandClass> | undefined;

/**
 * ioredis's Command with the keys given, not looked up in ioredis's table
 * of known commands (which has no rl commands): its slot is the first
 * key's, so a Cluster sends it to the node that owns it.
 */
function keyedCommand(): Promise<CommandClass> {
  commandClass ??= import("ioredis").then((m) => {
    const Command = (m as unknown as { Command: new (n: string, a: string[]) => { promise: Promise<unknown> } }).Command;
    class KeyedCommand extends Command {
      rlKeys: string[] = [];
      getKeys(): string[] {
        return this.rlKeys;
      }
    }
    return KeyedCommand as unknown as CommandClass;
  });
  return commandClass;
}

/** A transport over an ioredis `Redis` or `Cluster`. */
export function ioredisTransport(client: IoredisClient): Transport {
  return {
    send: async (keys, args) => {
      const Command = await keyedCommand();
      const cmd = new Command(args[0]!, args.slice(1)) as unknown as { rlKeys: string[]; promise: Promise<unknown> };
      cmd.rlKeys = [...keys];
      await client.sendCommand(cmd);
      return cmd.promise;
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
