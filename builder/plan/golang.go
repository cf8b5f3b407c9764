package plan

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"path"
	"strconv"
	"strings"
)

// goPlan builds the binary with the Go toolchain and runs it alone on Images.Runtime.
func (a *app) goPlan(d *dockerfile) error {
	data, err := a.read("go.mod")
	if err != nil {
		return err
	}
	module, goVersion := parseGoMod(data)
	var about []string
	if module != "" {
		about = append(about, "module "+module)
	}
	if goVersion != "" {
		about = append(about, "go "+goVersion)
	}
	if len(about) > 0 {
		a.note("found go.mod (%s)", strings.Join(about, ", "))
	} else {
		a.note("found go.mod")
	}
	a.noteProcfile()

	pkg, err := a.goMainPackage()
	if err != nil {
		return err
	}
	vendored := a.isFile("vendor/modules.txt")
	if vendored {
		a.note("found vendor/modules.txt: the build uses the vendored modules and downloads none")
	}
	if err := a.goProcesses(); err != nil {
		return err
	}

	d.header("a Go app (found go.mod)")
	d.blank()
	d.comment("Build stage: compile the app with the Go toolchain.")
	d.line("FROM %s AS build", a.cfg.Images.Go)
	d.line("WORKDIR /src")
	if vendored {
		d.comment(
			"Go's build cache is a cache mount, kept from one build of the app to the next",
			"(bex keeps each app's to it): a change of the code compiles the app's own",
			"packages again, not its dependencies and the standard library. It is not in",
			"the image, and the binary does not depend on what it holds: go compiles what",
			"is missing.",
		)
		d.line("ENV GOCACHE=%s", goBuildCache)
		d.comment("The dependencies are in vendor/, copied with the code: nothing to download.")
	} else {
		d.comment(
			"Go's build cache and module cache are cache mounts, kept from one build of the",
			"app to the next (bex keeps each app's to it): a change of the code compiles the",
			"app's own packages again, not its dependencies and the standard library. They",
			"are not in the image, and the binary does not depend on what they hold: go",
			"downloads and compiles what is missing.",
		)
		d.line("ENV GOCACHE=%s GOMODCACHE=%s", goBuildCache, goModCache)
		d.comment(
			"The module files first, in a step of its own: the download runs again only",
			"when go.mod or go.sum change, not at every change of the code.",
		)
		d.line("COPY go.mod go.sum* ./")
		d.line("RUN %s go mod download", cacheMount(goModCache))
	}
	mounts := cacheMount(goBuildCache)
	if !vendored {
		mounts = cacheMount(goModCache) + " " + mounts
	}
	d.line("COPY . .")
	d.comment("No cgo: a static binary runs on a base without a C library. -trimpath, -s and -w",
		"leave out local paths and debug symbols: a smaller file, the same at each build.")
	mod := ""
	if vendored {
		mod = " -mod=vendor"
	}
	d.line(`RUN %s \
    CGO_ENABLED=0 go build%s -trimpath -ldflags="-s -w" -o /out/app %s`, mounts, mod, pkg)
	d.blank()
	base := "the runtime base"
	if a.cfg.Images.Runtime == DefaultConfig().Images.Runtime {
		base = "a small base (CA certificates, time zones) with no shell"
	}
	d.comment("Run stage: the binary alone, on "+base+". Files the app reads at run time must",
		"be embedded in it (go:embed): nothing else of the tree is copied.")
	d.line("FROM %s", a.cfg.Images.Runtime)
	d.comment("Not root: nobody, as a number, which works on a base without /etc/passwd.")
	d.line("USER %s", nonRootUser)
	d.comment(
		"The app's own directory, where it starts: WORKDIR after USER makes it owned by",
		"nobody, so the app may write there (the base has no shell to run chown).",
	)
	d.line("WORKDIR %s", goHome)
	d.comment(
		"The binary last, owned by root (COPY ignores USER), so nobody cannot change it:",
		"the steps above stay cached, and a change of the code is this one layer.",
	)
	d.line("COPY --from=build /out/app /app")
	portEnv(d, " HOME="+goHome, homeWhy)
	if len(a.procs) > 0 {
		d.comment(
			"The base has no shell to run the Procfile's commands with: bex runs each",
			"process (web included) from its command, and this CMD is the default.",
		)
		if web, ok := a.web(); ok {
			a.note("Procfile web (%s) overrides CMD at run time: the runtime image has no shell, so the Dockerfile's CMD stays /app", web.command)
		}
	} else {
		d.comment("The app reads PORT and listens on it.")
	}
	d.exec("CMD", "/app")
	return nil
}

// goHome is a Go app's working directory and HOME: /app is the binary.
const goHome = "/home/app"

// Where the Go plan's caches are: the official image's own places for root
// (GOPATH /go, HOME /root), set in the Dockerfile so that a Go image configured
// otherwise uses them too.
const (
	goBuildCache = "/root/.cache/go-build"
	goModCache   = "/go/pkg/mod"
)

// goProcesses checks that each Procfile command can run without a shell, which a Go
// app's runtime image does not have.
func (a *app) goProcesses() error {
	for _, e := range a.procs {
		argv, err := splitCommand(e.command)
		if err != nil {
			return fmt.Errorf("Procfile line %d: the %s command cannot run because %v, and a Go app's image has no shell: write a plain command such as `web: /app -addr :$PORT`, or add a Dockerfile", e.line, e.name, err)
		}
		if argv[0] != "/app" {
			a.note("Procfile %s runs %q, but the image holds only the binary /app", e.name, argv[0])
		}
	}
	return nil
}

// parseGoMod returns the module path and the go version of a go.mod file; either is
// empty when the file does not say.
func parseGoMod(data []byte) (module, goVersion string) {
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "//")
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case "module":
			module = f[1]
			if u, err := strconv.Unquote(module); err == nil {
				module = u
			}
		case "go":
			goVersion = f[1]
		}
	}
	return module, goVersion
}

// goMainPackage returns the package to build: the root when it is package main,
// else the only cmd/NAME whose main.go is package main.
func (a *app) goMainPackage() (string, error) {
	if a.isMainPackage(".") {
		return ".", nil
	}
	var cmds []string
	entries, err := a.readDir("cmd")
	if err != nil {
		return "", err
	}
	for _, e := range entries { // ReadDir sorts by name: the notes are stable
		dir := "cmd/" + e.Name()
		// The name goes on a RUN line: only names that need no quoting.
		if e.IsDir() && plainName(e.Name()) && a.isFile(dir+"/main.go") && a.isMainFile(dir+"/main.go") {
			cmds = append(cmds, dir)
		}
	}
	switch len(cmds) {
	case 1:
		a.note("no main package at the root: building ./%s, the only command under cmd/", cmds[0])
		return "./" + cmds[0], nil
	case 0:
		return "", errors.New("go.mod found, but no main package to build: bex builds the package at the root of the module, or the one cmd/NAME/main.go, and found neither; add a Dockerfile to build another package")
	default:
		return "", fmt.Errorf("go.mod found, but no main package at the root and several commands under cmd/ (%s): put the app's main package at the root, or add a Dockerfile that builds the one to run", strings.Join(cmds, ", "))
	}
}

func plainName(s string) bool {
	return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

// isMainPackage reports whether a Go file of dir (tests aside) is package main.
func (a *app) isMainPackage(dir string) bool {
	entries, err := a.readDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") && a.isMainFile(path.Join(dir, n)) {
			return true
		}
	}
	return false
}

// isMainFile reports whether the Go file name says package main. Only the start of
// the file is read: the package clause comes first.
func (a *app) isMainFile(name string) bool {
	head, err := a.readUpTo(name, 64<<10)
	if err != nil {
		return false
	}
	file, err := parser.ParseFile(token.NewFileSet(), name, head, parser.PackageClauseOnly)
	return err == nil && file.Name.Name == "main"
}
