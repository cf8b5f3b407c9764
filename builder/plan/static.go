package plan

import (
	"errors"
	"strings"
)

// staticPlan serves the tree as files with busybox httpd.
//
// busybox httpd serves every file under its directory, dotfiles included, and
// follows links wherever they point: what must not be served is kept out of the
// image. The build removes the dotfiles at any depth (.env, .git/, .htpasswd),
// but for the root's .well-known/ (ACME challenges, security.txt), and the files
// that are bex's and not the site's (Procfile, app.json); a link that leads out of
// the site (to /etc/passwd, to /proc/self/environ and the app's config) is
// removed, with a line in the build's output that names it. httpd itself refuses
// a path that climbs out with "..".
func (a *app) staticPlan(d *dockerfile) error {
	a.note("found index.html: a static site, served by busybox httpd")
	a.noteProcfile()
	d.header("a static site (found index.html)")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Static)
	d.comment("The site, served from /srv and owned by the user that serves it.")
	copyOwned(d, nonRootUser, ".", "/srv")
	d.comment(
		"httpd would serve every file: the dotfiles go (.env, .git/, at any depth), except",
		"the .well-known/ of the root (ACME challenges, security.txt), and so do the",
		"Procfile and app.json, which are bex's. It follows links: one that leads out of",
		"/srv (to /etc/passwd, or to /proc/self/environ and the app's config) is removed,",
		"and the build says so. /srv itself is the user's too.",
	)
	d.line("RUN %s", staticClean)
	d.comment("Not root: nobody, as a number.")
	d.line("USER %s", nonRootUser)
	portEnv(d, "")
	a.startWithShell(d, []string{
		"busybox httpd in the foreground (-f), logging each request (-v), on $PORT: sh",
		"expands the variable, and exec makes httpd the main process, to get the stop signal.",
	}, []string{"sh", "-c", `exec httpd -f -v -p "${PORT:-` + DefaultPort + `}" -h /srv`}, "busybox httpd")
	return nil
}

// staticClean is the shell step that removes the dotfiles of /srv (not the root's
// .well-known/, but the dotfiles in it) and bex's files, then the links that
// resolve outside /srv (readlink -f follows every link of the chain), and gives
// /srv to the user. It runs after the copy, not as COPY --exclude: with exclude
// patterns, BuildKit follows the context's links to checksum it, and a link to an
// absolute path fails the build with "not found". A link to a file that is left out (env -> .env) resolves inside and
// serves nothing.
const staticClean = `cd /srv && find . -mindepth 1 -name '.*' ! -path ./.well-known -prune -exec rm -rf {} + && rm -f Procfile app.json && \
    find /srv -type l -exec sh -c 'for l; do t=$(readlink -f "$l"); case "$t" in /srv|/srv/*) ;; *) echo "not served: ${l#/srv/} is a link to $(readlink "$l"), outside the site; put the file itself in the repository to serve it" >&2; rm "$l";; esac; done' sh {} + && \
    chown ` + nonRootUser + ` /srv`

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
	d.comment("The app as it is, owned by the user that runs it: the Procfile's commands run",
		"from here, and may write into the tree.")
	copyOwned(d, nonRootUser, ".", ".")
	d.comment("The workdir too, which WORKDIR made as root.")
	d.line("RUN chown %s .", nonRootUser)
	d.comment("Not root: nobody, as a number.")
	d.line("USER %s", nonRootUser)
	portEnv(d, " HOME=/app", homeWhy)
	a.startWithShell(d, nil, nil, "")
	return nil
}
