// An Express app that bex builds without a Dockerfile: `npm ci` installs express from
// package-lock.json, and `node server.js` (no start script) serves on $PORT.
const express = require("express");

const app = express();
const port = Number(process.env.PORT || 8080);

app.get("/", (req, res) => {
  res.type("text/plain").send(`hello from node ${process.version}, express ${require("express/package.json").version}, uid ${process.getuid()}\n`);
});

app.listen(port, "0.0.0.0", () => console.log(`listening on ${port}`));
