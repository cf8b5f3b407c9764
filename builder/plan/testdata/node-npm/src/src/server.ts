import { createServer } from "node:http";
createServer((_, res) => res.end("hello")).listen(Number(process.env.PORT));
