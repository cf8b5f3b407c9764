package plan

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// pythonPlan installs the dependencies with pip and runs the app as nobody.
func (a *app) pythonPlan(d *dockerfile) error {
	var (
		names      []string // the dependencies' names, when known
		depsLayer  func()   // writes the dependencies' layer, before the code
		afterCode  []string // RUN after COPY . .
		fromTree   bool     // the install needs the whole tree
		hasReqs    = a.isFile("requirements.txt")
		hasProject = a.isFile("pyproject.toml")
	)
	switch {
	case hasReqs:
		data, err := a.read("requirements.txt")
		if err != nil {
			return err
		}
		var refs []string
		names, refs = parseRequirements(data)
		if len(names) > 0 {
			a.note("found requirements.txt (%s)", plural(len(names), "package"))
		} else {
			a.note("found requirements.txt")
		}
		if hasProject {
			a.note("also found pyproject.toml: requirements.txt lists the dependencies")
		}
		install := "RUN " + pipCacheMount + " pip install -r requirements.txt"
		local, ok := a.requirementFiles("requirements.txt", refs, 0)
		switch {
		case !ok:
			fromTree = true
			a.note("requirements.txt refers to other files (%s): it is installed with the code, not in a layer of its own", strings.Join(refs, ", "))
			afterCode = []string{install}
		case len(local) > 0:
			a.note("requirements.txt refers to %s: they are copied with it, before the code", strings.Join(local, ", "))
			depsLayer = func() {
				d.comment(
					"The dependencies first, from requirements.txt and the files it refers to only, in",
					"a layer of their own: it is cached until they change, instead of installing again",
					"at every change of the code.",
				)
				d.line("COPY requirements.txt ./")
				for _, p := range local {
					d.line("COPY %s ./%s", p, p)
				}
				d.line("%s", install)
			}
		default:
			depsLayer = func() {
				d.comment(
					"The dependencies first, from requirements.txt only, in a layer of their own: it",
					"is cached until requirements.txt changes, instead of installing again at every",
					"change of the code.",
				)
				d.line("COPY requirements.txt ./")
				d.line("%s", install)
			}
		}
	default:
		data, err := a.read("pyproject.toml")
		if err != nil {
			return err
		}
		proj := parsePyproject(data)
		var about []string
		if proj.name != "" {
			about = append(about, "project "+proj.name)
		}
		if proj.depsKnown {
			about = append(about, plural(len(proj.deps), "dependency"))
		}
		if len(about) > 0 {
			a.note("found pyproject.toml (%s)", strings.Join(about, ", "))
		} else {
			a.note("found pyproject.toml")
		}
		afterCode = []string{"RUN " + pipCacheMount + " pip install ."}
		switch {
		case !proj.depsKnown:
			fromTree = true
			a.note("pyproject.toml has no [project] dependencies list that bex can read: they are installed with the code, not in a layer of their own")
		case len(proj.deps) == 0:
		default:
			for _, dep := range proj.deps {
				names = append(names, requirementName(dep))
			}
			depsLayer = func() {
				d.comment(
					"The dependencies first, as pyproject.toml lists them, in a layer of their own: it",
					"is cached until this list changes, instead of installing again at every change of",
					"the code. Copying pyproject.toml alone would not do: `pip install .` builds the",
					"project, which needs its code. The trade-off: this list is a copy, so when the",
					"file is kept as the app's Dockerfile, a new dependency is installed by the",
					"`pip install .` below instead, uncached, until it is added here too.",
				)
				d.line("RUN %s pip install \\", pipCacheMount)
				for i, dep := range proj.deps {
					end := " \\"
					if i == len(proj.deps)-1 {
						end = ""
					}
					d.line("    %s%s", shellQuote(dep), end)
				}
			}
		}
	}
	a.noteProcfile()

	// The start command: gunicorn when the app depends on it and has a WSGI module,
	// else the app's script. The Procfile's web, if any, takes its place.
	var start, why []string
	var desc string
	if slices.Contains(names, "gunicorn") {
		for _, m := range []struct{ file, module string }{{"wsgi.py", "wsgi"}, {"app.py", "app"}} {
			if !a.isFile(m.file) {
				continue
			}
			data, err := a.read(m.file)
			if err != nil {
				return err
			}
			target := m.module + ":" + wsgiVariable(data, m.file == "wsgi.py")
			start = []string{"sh", "-c", shellCommand(`gunicorn --bind "0.0.0.0:${PORT:-` + DefaultPort + `}" --access-logfile - ` + target)}
			why = []string{
				"gunicorn is among the dependencies and " + m.file + " is the WSGI app: serve it on",
				"every interface at $PORT, and log each request to the output.",
			}
			desc = "gunicorn " + target
			break
		}
	}
	if start == nil {
		for _, f := range []string{"app.py", "main.py"} {
			if a.isFile(f) {
				start = []string{"python", f}
				why = []string{f + " is the app."}
				desc = "python " + f
				break
			}
		}
	}
	if start == nil && len(a.procs) == 0 {
		return errors.New("no start command for this Python app: add a Procfile with a web process (web: gunicorn app:app), or an app.py or main.py")
	}
	if _, hasWeb := a.web(); desc != "" && !hasWeb {
		a.note("start: %s", desc)
	}

	what := "requirements.txt"
	if !hasReqs {
		what = "pyproject.toml"
	}
	d.header("a Python app (found " + what + ")")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Python)
	d.comment(
		"Output reaches the logs at once, not when a buffer fills. No .pyc files next to the",
		"code: written at run time, they would be lost with each instance. pip says nothing",
		"about running as root or about its own version.",
	)
	d.line("ENV PYTHONUNBUFFERED=1 \\\n    PYTHONDONTWRITEBYTECODE=1 \\\n    PIP_DISABLE_PIP_VERSION_CHECK=1 \\\n    PIP_ROOT_USER_ACTION=ignore")
	d.line("WORKDIR /app")
	d.comment(
		"pip's cache is a cache mount, kept from one build of the app to the next and in no",
		"image: an install downloads and builds again only the packages that are new.",
	)
	if depsLayer != nil {
		depsLayer()
	}
	if len(afterCode) == 0 {
		// No root step after the code: the workdir and what the install wrote are
		// given to the user before it, in a step that stays cached with them.
		d.comment("The workdir and what the root steps wrote into it are the app's user's too.")
		ownRest(d, nonRootUser)
	}
	if fromTree {
		d.comment(
			"The code, owned by the user that runs it (the app may write into its tree), and",
			"the dependencies with it: any change of the code installs them again, because",
			"the install needs more of the tree than one file.",
		)
	} else {
		d.comment("The code, owned by the user that runs it: the app may write into its tree.")
	}
	copyOwned(d, nonRootUser, ".", ".")
	for _, l := range afterCode {
		d.line("%s", l)
	}
	if len(afterCode) > 0 {
		d.comment("The workdir and what the root steps wrote into it are the app's user's too.")
		ownRest(d, nonRootUser)
	}
	d.blank()
	d.comment("Not root: nobody, as a number.")
	d.line("USER %s", nonRootUser)
	portEnv(d, " HOME=/app", homeWhy)
	a.startWithShell(d, why, start, desc)
	return nil
}

// requirementFiles says which files and directories of the tree the
// requirements file from needs, besides itself, when refs (what it refers to)
// are all plain paths inside the tree other than its root: other requirements
// and constraints files (read in turn, relative to their own directory, as pip
// does), a directory of wheels, a local package. ok is false when one is not
// (a URL, a path outside the tree or through a symbolic link, the tree itself,
// a name a Dockerfile's COPY would read otherwise): the install then needs the
// whole tree. depth bounds the files read in a chain (or a loop).
func (a *app) requirementFiles(from string, refs []string, depth int) (paths []string, ok bool) {
	if depth > 4 {
		return nil, false
	}
	for _, ref := range refs {
		p := path.Clean(path.Join(path.Dir(from), ref))
		if !plainPath.MatchString(p) || strings.ContainsAny(ref, " \t\"'$*?[]\\") || p == "." || p == ".." || strings.HasPrefix(p, "../") || path.IsAbs(ref) {
			return nil, false
		}
		// No link along the way: what COPY copies is what was read here.
		if r, err := a.resolve(p); err != nil || r != p {
			return nil, false
		}
		fi, err := a.stat(p)
		if err != nil || !fi.IsDir() && !fi.Mode().IsRegular() {
			return nil, false
		}
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
		if fi.Mode().IsRegular() && (strings.HasSuffix(p, ".txt") || strings.HasSuffix(p, ".in")) {
			data, err := a.readUpTo(p, 1<<20)
			if err != nil {
				return nil, false
			}
			_, more := parseRequirements(data)
			nested, ok := a.requirementFiles(p, more, depth+1)
			if !ok {
				return nil, false
			}
			for _, n := range nested {
				if !slices.Contains(paths, n) {
					paths = append(paths, n)
				}
			}
		}
	}
	slices.Sort(paths)
	return paths, true
}

// plainPath is a path a requirements file may name and a COPY line may carry as
// it is: no spaces, quotes, globs, variables or options.
var plainPath = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/-]*$`)

// pipCacheMount mounts pip's cache for root, who installs (HOME /root).
var pipCacheMount = cacheMount("/root/.cache/pip")

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "y") {
		what = strings.TrimSuffix(what, "y") + "ie"
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// parseRequirements returns the normalised names of the packages a requirements file
// lists, and the other files and local paths it refers to (-r, -c, -e, ./dir, a
// --find-links directory, a file: index), which pip then needs to see.
func parseRequirements(data []byte) (names, refs []string) {
	text := strings.ReplaceAll(string(data), "\\\r\n", "")
	text = strings.ReplaceAll(text, "\\\n", "") // continuation lines
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "", strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "-"):
			opt, arg, _ := strings.Cut(strings.Replace(line, "=", " ", 1), " ")
			switch opt {
			case "-r", "--requirement", "-c", "--constraint", "-e", "--editable":
				refs = append(refs, strings.TrimSpace(arg))
			case "-f", "--find-links", "-i", "--index-url", "--extra-index-url":
				// A directory of wheels committed with the app (--find-links ./wheels,
				// with --no-index where there is no PyPI) is a local path pip must see
				// when it installs; a URL is not.
				if arg = strings.TrimSpace(arg); strings.HasPrefix(arg, "file:") || opt != "-i" && opt != "--index-url" && opt != "--extra-index-url" && !strings.Contains(arg, "://") {
					refs = append(refs, arg)
				}
			}
		case strings.HasPrefix(line, "."), strings.HasPrefix(line, "/"), strings.HasPrefix(line, "file:"):
			refs = append(refs, line)
		default:
			if n := requirementName(line); n != "" {
				names = append(names, n)
			}
		}
	}
	return names, refs
}

// requirementName is the package name of a requirement ("Flask[async]>=3" → "flask"),
// normalised as PEP 503 says; empty for a bare URL.
func requirementName(req string) string {
	if strings.Contains(req, "://") && !strings.Contains(req, "@") {
		return ""
	}
	end := strings.IndexAny(req, "[<>=!~;@ (\t")
	if end >= 0 {
		req = req[:end]
	}
	return strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(req))
}

// wsgiVariable is the name of the WSGI app in a module: app or application, whichever
// the module defines or imports at the top level, else gunicorn's own default
// (application) for wsgi.py and Flask's habit (app) for app.py.
func wsgiVariable(src []byte, isWSGI bool) string {
	order := []string{"app", "application"}
	if isWSGI {
		order = []string{"application", "app"}
	}
	for _, name := range order {
		def := regexp.MustCompile(`(?m)^` + name + `\s*[:=]|^from\s+\S+\s+import\s+.*\b` + name + `\b`)
		if def.Match(src) {
			return name
		}
	}
	return order[0]
}

// pyproject is what a plan needs of pyproject.toml.
type pyproject struct {
	name      string
	deps      []string
	depsKnown bool // [project] dependencies is a static list that was read
}

var tomlHeader = regexp.MustCompile(`^\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$`)

// parsePyproject reads the name and the dependencies of [project]. It is a small
// reader for the part of TOML that these keys use (strings, arrays of strings,
// comments), not a TOML parser: what it does not understand, it leaves unknown, and
// the plan then installs the dependencies with the code.
func parsePyproject(data []byte) pyproject {
	var p pyproject
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	table, dynamic := "", false
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if m := tomlHeader.FindStringSubmatch(line); m != nil {
			table = m[1]
			continue
		}
		if table != "project" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		rest := strings.TrimSpace(value) + "\n" + strings.Join(lines[i+1:], "\n")
		switch strings.TrimSpace(key) {
		case "name":
			if s, _, ok := tomlString(rest); ok {
				p.name = s
			}
		case "dependencies":
			p.deps, p.depsKnown = tomlStrings(rest)
		case "dynamic":
			if list, ok := tomlStrings(rest); ok && slices.Contains(list, "dependencies") {
				dynamic = true
			}
		}
	}
	if dynamic {
		p.deps, p.depsKnown = nil, false
	}
	for _, dep := range p.deps {
		// A dependency goes on a RUN line: no control characters.
		if strings.ContainsFunc(dep, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			p.deps, p.depsKnown = nil, false
		}
	}
	return p
}

// tomlString reads one basic or literal string at the start of s: its value and the
// rest of s after it.
func tomlString(s string) (value, rest string, ok bool) {
	if strings.HasPrefix(s, `"""`) || strings.HasPrefix(s, "'''") || s == "" {
		return "", s, false // multi-line strings: not for names and requirements
	}
	q := s[0]
	if q != '"' && q != '\'' {
		return "", s, false
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), s[i+1:], true
		case c == '\n':
			return "", s, false
		case c == '\\' && q == '"':
			if i+1 == len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", s, false // other escapes: not in requirements
			}
			i++
			b.WriteByte(s[i])
		default:
			b.WriteByte(c)
		}
	}
	return "", s, false
}

// tomlStrings reads an array of strings at the start of s, across lines and comments.
func tomlStrings(s string) ([]string, bool) {
	skip := func(s string) string {
		for {
			s = strings.TrimLeft(s, " \t\r\n")
			if !strings.HasPrefix(s, "#") {
				return s
			}
			_, s, _ = strings.Cut(s, "\n")
		}
	}
	if !strings.HasPrefix(s, "[") {
		return nil, false
	}
	s = s[1:]
	list := []string{}
	for {
		s = skip(s)
		if strings.HasPrefix(s, "]") {
			return list, true
		}
		v, rest, ok := tomlString(s)
		if !ok {
			return nil, false
		}
		list = append(list, v)
		s = skip(rest)
		switch {
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case strings.HasPrefix(s, "]"):
			return list, true
		default:
			return nil, false
		}
	}
}
