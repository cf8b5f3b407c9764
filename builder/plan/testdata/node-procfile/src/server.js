require("node:http").createServer((_, r) => r.end("chat")).listen(process.env.PORT);
