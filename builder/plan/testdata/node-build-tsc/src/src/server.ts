// A TypeScript app with no dependency at run time: the build script (tsc, a
// devDependency) compiles it to dist/, and the start script runs that.
declare const require: (name: string) => any;
declare const process: { env: Record<string, string | undefined>; version: string; getuid(): number };

const http = require("http");
const port: number = Number(process.env.PORT || 8080);

http
  .createServer((_req: unknown, res: { end(body: string): void }) => {
    res.end(`compiled by tsc, served by node ${process.version} as uid ${process.getuid()}\n`);
  })
  .listen(port, "0.0.0.0");
