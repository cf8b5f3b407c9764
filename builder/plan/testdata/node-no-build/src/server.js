const express = require("express");
express().get("/", (_, res) => res.send("hi")).listen(process.env.PORT);
