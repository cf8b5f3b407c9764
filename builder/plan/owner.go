package plan

import (
	"fmt"
	"strings"
)

// The app's files belong to the user its processes run as, in every plan, as on
// Heroku and Dokku: a release command, a predeploy, a one-off or a process may
// write into its own tree (Rails' tmp/ and log/, asset caches, Django's
// collectstatic, `touch /app/x`). What it writes stays in the instance's writable
// layer and goes away with the instance; the image does not change. The user stays
// non-root: owning its files gives it no right over anything else in the image.

// copyOwned writes the COPY of the app's tree (src, with any COPY flags in it) to
// dest, owned by user: the copy itself sets the owner, so no step rewrites the
// files afterwards (which would store each one twice in the image).
func copyOwned(d *dockerfile, user, src, dest string) {
	d.line("COPY --chown=%s %s %s", user, src, dest)
}

// ownRest writes the step that gives user what the copy did not: the workdir
// itself (made by WORKDIR as root) and what the root steps wrote into the tree
// (a build's output, pip's build/ and *.egg-info). It changes only what is not
// user's yet, so it costs little at each build. Each skip is a path (find's -path
// syntax, such as ./node_modules/*) whose files stay root's: readable, and not
// stored a second time in a layer of their own.
func ownRest(d *dockerfile, user string, skip ...string) {
	prune := ""
	for _, s := range skip {
		prune += fmt.Sprintf("-path %s -prune -o ", shellQuote(s))
	}
	d.line("RUN find . %s! -user %s -exec chown -h %s {} +", prune, userName(user), user)
}

// userName is the user part of USER's user[:group], for find's -user.
func userName(user string) string {
	name, _, _ := strings.Cut(user, ":")
	return name
}

// homeWhy says why a plan that runs as nobody sets HOME: nobody's is /nonexistent,
// where tools that keep a cache or a history under HOME fail.
var homeWhy = "HOME is the app's own directory, as on Heroku: nobody's HOME does not exist, and tools keep their caches there."
