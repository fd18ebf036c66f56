// Starts the reference Durable Streams server (@durable-streams/server) on
// the port given as argv[2] (0 = any), file-backed in the directory argv[3]
// (else in memory); prints "listening URL" when ready.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 0)
const dataDir = process.argv[3]
const server = new DurableStreamTestServer({ port, host: "127.0.0.1", longPollTimeout: 500, ...(dataDir ? { dataDir } : {}) })
const url = await server.start()
console.log(`listening ${url}`)
process.on("SIGTERM", async () => { await server.stop(); process.exit(0) })
