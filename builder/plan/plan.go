package plan

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// The stacks, in the order detection tries them.
const (
	StackGo       = "go"
	StackRuby     = "ruby"
	StackPHP      = "php"
	StackNode     = "node"
	StackPython   = "python"
	StackStatic   = "static"
	StackProcfile = "procfile"
)

// DefaultPort is the port an app listens on when PORT is not set. bex always sets
// PORT; the default makes an image run as is, by hand.
const DefaultPort = "8080"

// nonRootUser is nobody: numeric, so USER works on bases with no /etc/passwd
// (scratch, distroless), and with the group given, so that the process does not fall
// back to group 0 (root) on such bases.
const nonRootUser = "65534:65534"

// ErrNothingDetected is returned by Detect when the tree matches no stack.
var ErrNothingDetected = errors.New("no Dockerfile and no known stack: looked for go.mod, Gemfile, composer.json, index.php, package.json, requirements.txt, pyproject.toml, index.html and Procfile; add a Dockerfile, or one of these files")

// Plan is how to build an app that has no Dockerfile.
type Plan struct {
	// Stack is what detection found: "go", "ruby", "php", "node", "python", "static"
	// or "procfile".
	Stack string
	// Dockerfile is the generated Dockerfile, with comments that say why each step is
	// there.
	Dockerfile string
	// Processes maps each process type of the Procfile to its command line, as
	// written; nil when the app has no Procfile or an empty one.
	Processes map[string]string
	// Notes say what detection found, one line each.
	Notes []string
	// Shell says whether the image has /bin/sh to run the Procfile's commands with.
	// It is false for Go, whose runtime image is taken to have none: the Dockerfile's
	// CMD is then the binary, and the runtime runs each process from Command.
	Shell bool
}

// Command returns the argv that runs the process type of the Procfile in the image
// built from p, in the syntax of a Kubernetes container command (the App's
// spec.processes[].command): `$(NAME)` is expanded from the process's environment and
// `$$` is a `$`.
//
// When the image has a shell (p.Shell), that is `sh -c` with the command line (`exec`
// in front when it is one simple command, so that the app gets the stop signal).
// Otherwise the command is split into words as sh would split it, and `$PORT` or
// `${PORT}` become `$(PORT)`, for the runtime to expand.
func (p *Plan) Command(process string) ([]string, error) {
	command, ok := p.Processes[process]
	if !ok {
		return nil, fmt.Errorf("the Procfile has no %q process", process)
	}
	argv, err := p.CommandLine(command)
	if err != nil {
		return nil, fmt.Errorf("process %q: %v", process, err)
	}
	return argv, nil
}

// CommandLine returns the argv that runs one command line in the image built from
// p, as Command does for a Procfile's process: app.json's scripts become argv this
// way, so that they run as the Procfile's commands do.
func (p *Plan) CommandLine(command string) ([]string, error) {
	if p.Shell {
		return []string{"sh", "-c", escapeKubernetes(shellCommand(command))}, nil
	}
	argv, err := splitCommand(command)
	if err != nil {
		return nil, fmt.Errorf("%v, and the image has no shell to run it", err)
	}
	return argv, nil
}

// Detect finds the stack of the source tree rooted at src and writes its Dockerfile.
// It reads a few small files of the tree, and follows links only while they stay
// inside it.
//
// A tree that matches no stack gives ErrNothingDetected. A malformed Procfile or
// package.json, a Go module with no main package or an app with no start command
// gives an error that says what to change, in one sentence meant for the user; an
// invalid cfg gives Config.Validate's error.
func Detect(src fs.FS, cfg Config) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &app{src: src, cfg: cfg}
	if err := a.readProcfile(); err != nil {
		return nil, err
	}
	stacks := []struct {
		name    string
		markers []string
		plan    func(*dockerfile) error
	}{
		{StackGo, []string{"go.mod"}, a.goPlan},
		// Ruby and PHP before Node: Rails and Laravel apps have a package.json for
		// their front end, and are served by Ruby and PHP.
		{StackRuby, []string{"Gemfile"}, a.rubyPlan},
		{StackPHP, []string{"composer.json", "index.php"}, a.phpPlan},
		{StackNode, []string{"package.json"}, a.nodePlan},
		{StackPython, []string{"requirements.txt", "pyproject.toml"}, a.pythonPlan},
		{StackStatic, []string{"index.html"}, a.staticPlan},
		{StackProcfile, []string{"Procfile"}, a.procfilePlan},
	}
	for i, s := range stacks {
		if !slices.ContainsFunc(s.markers, a.isFile) {
			continue
		}
		var d dockerfile
		if err := s.plan(&d); err != nil {
			return nil, err
		}
		// Say what else is there, so that "why is my site built as a Go app?" has
		// its answer in the notes.
		for _, later := range stacks[i+1:] {
			for _, m := range later.markers {
				if a.isFile(m) && m != "Procfile" {
					a.note("also found %s: the %s stack comes first", m, s.name)
				}
			}
		}
		p := &Plan{Stack: s.name, Dockerfile: d.String(), Notes: a.notes, Shell: s.name != StackGo}
		if len(a.procs) > 0 {
			p.Processes = make(map[string]string, len(a.procs))
			for _, e := range a.procs {
				p.Processes[e.name] = e.command
			}
		}
		return p, nil
	}
	return nil, ErrNothingDetected
}

// app is the source tree being detected, and what detection learnt so far.
type app struct {
	src   fs.FS
	cfg   Config
	procs []procEntry // the Procfile's entries, in file order
	notes []string
}

func (a *app) note(format string, args ...any) {
	a.notes = append(a.notes, fmt.Sprintf(format, args...))
}

func (a *app) readProcfile() error {
	if !a.isFile("Procfile") {
		return nil
	}
	data, err := a.read("Procfile")
	if err != nil {
		return err
	}
	a.procs, err = parseProcfile(data)
	return err
}

// web returns the Procfile's web process, if any.
func (a *app) web() (procEntry, bool) {
	for _, e := range a.procs {
		if e.name == "web" {
			return e, true
		}
	}
	return procEntry{}, false
}

// noteProcfile says what the Procfile holds.
func (a *app) noteProcfile() {
	if !a.isFile("Procfile") {
		return
	}
	if len(a.procs) == 0 {
		a.note("found Procfile, with no processes")
		return
	}
	a.note("found Procfile (%s)", strings.Join(a.procNames(), ", "))
}

// procNames are the Procfile's process types, sorted.
func (a *app) procNames() []string {
	names := make([]string, len(a.procs))
	for i, e := range a.procs {
		names[i] = e.name
	}
	slices.Sort(names)
	return names
}

// startWithShell writes the CMD of an image that has a shell: the Procfile's web
// process when there is one, else the stack's own start command (argv with the
// comment why, or nil for none; desc names it in the notes).
func (a *app) startWithShell(d *dockerfile, why []string, argv []string, desc string) {
	if web, ok := a.web(); ok {
		d.comment(
			"The Procfile's web process, through sh so that $PORT and the rest of its",
			"shell syntax work. bex runs the Procfile's other processes with the same image.",
		)
		d.exec("CMD", "sh", "-c", shellCommand(web.command))
		if desc != "" {
			a.note("Procfile web overrides the start command (%s)", desc)
		}
		return
	}
	if argv == nil {
		d.comment("No web process: bex runs the Procfile's processes with this image.")
		return
	}
	d.comment(why...)
	d.exec("CMD", argv...)
}

// portEnv writes the PORT default, with more variables and the comments that say why.
func portEnv(d *dockerfile, extra string, why ...string) {
	d.comment("bex gives each process the port to listen on in PORT; " + DefaultPort + " when run by hand.")
	d.comment(why...)
	d.line("ENV PORT=%s%s", DefaultPort, extra)
}
