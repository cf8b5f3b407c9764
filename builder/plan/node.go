package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// packageJSON is what a plan needs of package.json.
type packageJSON struct {
	scripts        map[string]string
	packageManager string // "pnpm@9.1.0"
	enginesNode    string
}

// parsePackageJSON reads package.json leniently: a field of an unexpected type is
// ignored, as npm would mostly do, but text that is not JSON is an error.
func parsePackageJSON(data []byte) (packageJSON, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := dec.Decode(&doc)
	if err == nil && dec.More() {
		_, err = dec.Token()
		if err == nil {
			err = errors.New("there is more after the top-level object")
		}
	}
	if err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			line, col := position(data, syn.Offset)
			return packageJSON{}, fmt.Errorf("package.json is not valid JSON: %v (line %d, column %d)", syn, line, col)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return packageJSON{}, errors.New("package.json is not valid JSON: it ends before the object is closed")
		}
		return packageJSON{}, fmt.Errorf("package.json is not valid JSON: %v", err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return packageJSON{}, errors.New("package.json is not valid JSON for a package: it must hold an object, such as {\"scripts\": {\"start\": \"node server.js\"}}")
	}
	var p packageJSON
	if s, ok := obj["scripts"].(map[string]any); ok {
		p.scripts = map[string]string{}
		for k, v := range s {
			if v, ok := v.(string); ok {
				p.scripts[k] = v
			}
		}
	}
	p.packageManager, _ = obj["packageManager"].(string)
	if e, ok := obj["engines"].(map[string]any); ok {
		p.enginesNode, _ = e["node"].(string)
	}
	return p, nil
}

// position turns a byte offset into a line and a column, both from 1.
func position(data []byte, offset int64) (line, col int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - bytes.LastIndexByte(before, '\n')
	if offset > 0 {
		col-- // the offset is past the character that failed
	}
	return line, max(col, 1)
}

// nodeManager is how one package manager installs and runs scripts.
type nodeManager struct {
	name     string
	lockfile string
	berry    bool // Yarn 2 or later
}

// nodeManager picks the package manager: package.json's packageManager field first,
// as corepack does, then the lockfile (pnpm, then yarn, then npm, as Railpack does: a
// stray package-lock.json is more often left by a one-off `npm install` than the
// other way round), else npm.
func (a *app) nodeManager(p packageJSON) nodeManager {
	locks := []nodeManager{{name: "pnpm", lockfile: "pnpm-lock.yaml"}, {name: "yarn", lockfile: "yarn.lock"}, {name: "npm", lockfile: "package-lock.json"}, {name: "npm", lockfile: "npm-shrinkwrap.json"}}
	var found []nodeManager
	for _, l := range locks {
		if a.isFile(l.lockfile) {
			found = append(found, l)
		}
	}
	var m nodeManager
	name, version, _ := strings.Cut(p.packageManager, "@")
	switch name {
	case "npm", "yarn", "pnpm":
		m.name = name
		for _, l := range found {
			if l.name == name {
				m.lockfile = l.lockfile
				break
			}
		}
		a.note("found package.json (%s, from its packageManager field %s)", name, p.packageManager)
	default:
		if p.packageManager != "" {
			a.note("package.json asks for %s, which bex does not support: the lockfile decides", p.packageManager)
		}
		m = nodeManager{name: "npm"}
		if len(found) > 0 {
			m = found[0]
			a.note("found package.json (%s, from %s)", m.name, m.lockfile)
		} else {
			a.note("found package.json (npm, no lockfile)")
		}
	}
	for _, l := range found {
		if l.lockfile != m.lockfile {
			a.note("also found %s: %s installs the dependencies", l.lockfile, m.name)
		}
	}
	if m.lockfile == "" {
		lock := map[string]string{"npm": "package-lock.json", "yarn": "yarn.lock", "pnpm": "pnpm-lock.yaml"}[m.name]
		a.note("no %s: the versions are resolved again at each build; commit it for repeatable builds", lock)
	}
	if m.name == "yarn" {
		major, _, _ := strings.Cut(version, ".")
		m.berry = (name == "yarn" && major != "" && major != "1") || a.isFile(".yarnrc.yml")
	}
	return m
}

// install is the command that installs the dependencies; prod leaves out
// devDependencies.
func (m nodeManager) install(prod bool) string {
	var cmd string
	switch {
	case m.name == "pnpm":
		cmd = "corepack enable && pnpm install"
		if m.lockfile != "" {
			cmd += " --frozen-lockfile"
		}
		if prod {
			cmd += " --prod"
		}
	case m.berry:
		// Yarn 2+ has no --production; its --immutable is 1's --frozen-lockfile.
		cmd = "corepack enable && yarn install"
		if m.lockfile != "" {
			cmd += " --immutable"
		}
	case m.name == "yarn":
		cmd = "yarn install"
		if m.lockfile != "" {
			cmd += " --frozen-lockfile"
		}
		if prod {
			cmd += " --production"
		}
	default:
		cmd = "npm install"
		if m.lockfile != "" {
			cmd = "npm ci"
		}
		if prod {
			cmd += " --omit=dev"
		}
	}
	return cmd
}

// nodeUser owns a Node app's files: the official image's node user and its group.
const nodeUser = "node:node"

// npmCache is npm's cache for root, who installs (the official image's HOME).
const npmCache = "/root/.npm"

// nodePlan installs the dependencies, builds, and starts the app as the node user.
func (a *app) nodePlan(d *dockerfile) error {
	data, err := a.read("package.json")
	if err != nil {
		return err
	}
	p, err := parsePackageJSON(data)
	if err != nil {
		return err
	}
	m := a.nodeManager(p)
	a.noteProcfile()
	if p.enginesNode != "" {
		a.note("package.json asks for node %s; the image is %s", p.enginesNode, a.cfg.Images.Node)
	}

	// The start command: the start script, else the file that npm itself would start.
	// The Procfile's web, if any, takes its place (startWithShell).
	var start, why []string
	var desc string
	build, hasBuild := p.scripts["build"]
	script := strings.TrimSpace(p.scripts["start"])
	switch ok := script != ""; {
	case ok && (p.scripts["prestart"] != "" || p.scripts["poststart"] != ""):
		start = []string{"npm", "start"}
		why = []string{"npm start, because package.json has scripts that npm runs around start."}
		desc = "npm start"
	case ok:
		start = []string{"sh", "-c", shellCommand(script)}
		why = []string{
			"The start script of package.json, run by sh rather than by npm: the app is then",
			"the main process, and gets the signal that stops it.",
		}
		desc = "the start script, " + script
	case a.isFile("server.js"), a.isFile("index.js"):
		file := "server.js"
		if !a.isFile(file) {
			file = "index.js"
		}
		start = []string{"node", file}
		why = []string{"No start script: " + file + " is the app."}
		desc = "node " + file + ", as there is no start script"
	case len(a.procs) == 0:
		return errors.New(`package.json has no "start" script and there is no server.js or index.js: add a "start" script to package.json, or a Procfile with a web process (web: node app.js)`)
	}
	if hasBuild {
		a.note("build script: %s", build)
	}
	if _, hasWeb := a.web(); desc != "" && !hasWeb {
		a.note("start: %s", desc)
	}

	d.header("a Node app (found package.json)")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Node)
	d.line("WORKDIR /app")
	manifests := []string{"package.json"}
	if m.lockfile != "" {
		manifests = append(manifests, m.lockfile)
	}
	for _, f := range []string{".npmrc", ".yarnrc.yml"} {
		if a.isFile(f) && (f != ".yarnrc.yml" || m.name == "yarn") {
			manifests = append(manifests, f)
		}
	}
	what := strings.Join(manifests, ", ")
	if i := strings.LastIndex(what, ", "); i >= 0 {
		what = what[:i] + " and " + what[i+2:]
	}
	d.comment("The dependencies first, from "+what+" only, in a layer of their own:",
		"it is cached until they change, instead of installing again at every change of the code.")
	d.line("COPY %s ./", strings.Join(manifests, " "))
	if m.berry && a.isDir(".yarn") {
		d.line("COPY .yarn ./.yarn")
	}
	run := "RUN "
	if m.name == "npm" {
		d.comment(
			"npm's cache is a cache mount, kept from one build of the app to the next and in",
			"no image: a changed lockfile downloads only the packages that are new.",
		)
		run += cacheMount(npmCache) + " "
	}
	if hasBuild {
		d.comment("devDependencies too: the build script needs them (a compiler, a bundler).")
		d.line("%s%s", run, m.install(false))
	} else {
		if m.berry {
			d.comment("Yarn 2+ installs devDependencies too: it has no production-only install.")
		} else {
			d.comment("Only the production dependencies: there is no build script to need the others.")
		}
		d.line("%s%s", run, m.install(true))
	}
	own := func() {
		d.comment(
			"The workdir and what the root steps wrote are the node user's too, but for the",
			"files in node_modules, which stay root's (readable, and not stored twice in the",
			"image); node_modules itself is the node user's, for the caches tools make in it.",
		)
		ownRest(d, nodeUser, "./node_modules/*")
	}
	if !hasBuild {
		// No root step after the code: this step stays cached with the install,
		// instead of running at every change of the code.
		own()
	}
	d.comment("The code, owned by the node user that runs it: the app may write into its tree.")
	copyOwned(d, nodeUser, ".", ".")
	if hasBuild {
		d.line("RUN %s run build", m.name)
		own()
	}
	d.blank()
	d.comment("Not root: the image's node user.")
	d.line("USER node")
	if hasBuild {
		portEnv(d, " NODE_ENV=production", "NODE_ENV=production makes libraries run in production mode;",
			"it is set after the build, which would otherwise have been without its devDependencies.")
	} else {
		portEnv(d, " NODE_ENV=production", "NODE_ENV=production makes libraries run in production mode.")
	}
	d.comment("The programs of node_modules/.bin (next, vite, ...), for scripts, as npm has them.")
	d.line("ENV PATH=/app/node_modules/.bin:$PATH")
	a.startWithShell(d, why, start, desc)
	return nil
}
