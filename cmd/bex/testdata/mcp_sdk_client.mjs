// An agent's side of bex's MCP server, with the official TypeScript SDK's client
// (@modelcontextprotocol/sdk, installed by hack/tools.sh): it lists the tools, which
// makes the SDK check every later structured result against the tool's output
// schema, as an agent's client does, and calls the tools it is given. It prints one
// JSON report on stdout of what the SDK handed back, or the message it threw, so
// that the Go test (mcp_test.go) judges it.
//
//   node mcp_sdk_client.mjs NODE_MODULES URL TOKEN CALLS_JSON
//
// CALLS_JSON: [{"name": TOOL, "arguments": {...}}, ...]. The token comes in the
// environment variable BEX_TOKEN when TOKEN is "-", to keep it off the command line.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const [modules, url, tokenArg, callsJSON] = process.argv.slice(2);
const token = tokenArg === '-' ? process.env.BEX_TOKEN : tokenArg;
// The SDK is installed outside this folder (bin/mcp-sdk/node_modules): resolve it
// from there, through the package's exports as any client would.
const require = createRequire(join(modules, 'resolve-from-here.js'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const sdk = JSON.parse(readFileSync(join(modules, '@modelcontextprotocol/sdk/package.json'), 'utf8')).version;

const client = new Client({ name: 'bex-test-typescript', version: '1' });
const transport = new StreamableHTTPClientTransport(new URL(url), {
	requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
const report = { sdk, tools: (await client.listTools()).tools, calls: [] };
for (const c of JSON.parse(callsJSON)) {
	const start = performance.now();
	try {
		const result = await client.callTool(c);
		report.calls.push({ name: c.name, ms: Math.round(performance.now() - start), result });
	} catch (e) {
		report.calls.push({ name: c.name, ms: Math.round(performance.now() - start), threw: e instanceof Error ? e.message : String(e) });
	}
}
await client.close();
process.stdout.write(JSON.stringify(report) + '\n');
