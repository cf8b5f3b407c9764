package plan

import (
	"errors"
	"strings"
)

// staticPlan serves the tree as files with busybox httpd.
func (a *app) staticPlan(d *dockerfile) error {
	a.note("found index.html: a static site, served by busybox httpd")
	a.noteProcfile()
	d.header("a static site (found index.html)")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Static)
	d.comment("The site as it is: every file of the app, served from /srv.")
	d.line("COPY . /srv")
	d.comment("Not root: nobody, as a number. The files stay owned by root, so the server cannot change them.")
	d.line("USER %s", nonRootUser)
	portEnv(d, "")
	a.startWithShell(d, []string{
		"busybox httpd in the foreground (-f), logging each request (-v), on $PORT: sh",
		"expands the variable, and exec makes httpd the main process, to get the stop signal.",
	}, []string{"sh", "-c", `exec httpd -f -v -p "${PORT:-` + DefaultPort + `}" -h /srv`}, "busybox httpd")
	return nil
}

// procfilePlan runs the Procfile's commands on a plain system with a shell.
func (a *app) procfilePlan(d *dockerfile) error {
	if len(a.procs) == 0 {
		return errors.New("the Procfile lists no processes, and bex found no other stack: add a line such as `web: ./server` to the Procfile, or add a Dockerfile")
	}
	a.note("found only a Procfile (%s): its commands run on %s", strings.Join(a.procNames(), ", "), a.cfg.Images.Stack)
	d.header("an app with only a Procfile")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Stack)
	d.line("WORKDIR /app")
	d.comment("The app as it is: the Procfile's commands run from here.")
	d.line("COPY . .")
	d.comment("Not root: nobody, as a number. The files stay owned by root, so the app cannot rewrite them.")
	d.line("USER %s", nonRootUser)
	portEnv(d, "")
	a.startWithShell(d, nil, nil, "")
	return nil
}
