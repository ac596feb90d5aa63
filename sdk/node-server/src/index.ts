/**
 * @rl/server: rl inside Node.js applications (the server side; the client
 * side that honours Retry-After is @rl/client).
 */
export { RlConfigError } from "./args.js";
export * from "./commands.js";
export * from "./clients.js";
export * from "./responses.js";
export * from "./rules.js";
export * from "./stores.js";
export * from "./engine.js";
export { LocalLimiter } from "./fallback.js";
export { rlExpress, applyVerdict } from "./express.js";
export { rlFastify, type RlFastifyOptions } from "./fastify.js";
