require("node:http").createServer((_, r) => r.end("api")).listen(process.env.PORT);
