// hello-db writes and reads through DATABASE_URL (pg, the Postgres driver most
// Node apps use) and REDIS_URL (redis, the official client), and says whether it
// can open a TCP connection to an address: what an app does, and what a probe
// of the network's rules asks.
const http = require('http');
const net = require('net');
const { Client } = require('pg');
const { createClient } = require('redis');

async function withPostgres(fn) {
  const c = new Client({ connectionString: process.env.DATABASE_URL, connectionTimeoutMillis: 3000 });
  await c.connect();
  try {
    await c.query('CREATE TABLE IF NOT EXISTS notes (v text PRIMARY KEY)');
    return await fn(c);
  } finally {
    await c.end();
  }
}

async function withRedis(fn) {
  const c = createClient({ url: process.env.REDIS_URL, socket: { connectTimeout: 3000, reconnectStrategy: false } });
  c.on('error', () => {});
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.quit();
  }
}

function reach(host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port: Number(port) });
    s.setTimeout(2000, () => { s.destroy(); resolve('unreachable: timeout'); });
    s.on('connect', () => { s.destroy(); resolve('connected'); });
    s.on('error', (e) => resolve('unreachable: ' + e.code));
  });
}

const routes = {
  '/': async () => 'hello-db',
  '/env': async () => ['DATABASE_URL', 'REDIS_URL'].map((k) => `${k}=${process.env[k] ? 'set' : 'unset'}`).join(' '),
  '/pg/write': async (q) => withPostgres(async (c) => {
    await c.query('INSERT INTO notes (v) VALUES ($1) ON CONFLICT DO NOTHING', [q.get('v')]);
    return 'wrote ' + q.get('v');
  }),
  '/pg/read': async () => withPostgres(async (c) => {
    const r = await c.query("SELECT coalesce(string_agg(v, ',' ORDER BY v), '') AS notes FROM notes");
    return 'notes: ' + r.rows[0].notes;
  }),
  '/redis/set': async (q) => withRedis(async (c) => { await c.set('note', q.get('v')); return 'set ' + q.get('v'); }),
  '/redis/get': async () => withRedis(async (c) => 'note: ' + (await c.get('note'))),
  '/reach': async (q) => reach(q.get('host'), q.get('port')),
};

http.createServer(async (req, res) => {
  const u = new URL(req.url, 'http://x');
  const route = routes[u.pathname];
  if (!route) {
    res.writeHead(404).end('not found\n');
    return;
  }
  try {
    res.writeHead(200).end((await route(u.searchParams)) + '\n');
  } catch (e) {
    res.writeHead(500).end('error: ' + e.message + '\n');
  }
}).listen(Number(process.env.PORT || 5000));
