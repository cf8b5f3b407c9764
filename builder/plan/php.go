package plan

import (
	"errors"
	"strings"
)

// phpRouter is where the PHP image keeps the router script of PHP's built-in
// server: outside /app, so that it is neither served nor overwritten by the app.
const phpRouter = "/usr/local/lib/bex/router.php"

// phpPlan installs a PHP app's composer.json dependencies in a Composer stage and
// serves the app with PHP's built-in server, as nobody, behind a router that keeps
// the files that are not the site's to itself.
func (a *app) phpPlan(d *dockerfile) error {
	composer := a.isFile("composer.json")
	hasLock := a.isFile("composer.lock")
	if composer {
		// Read it, so that a link out of the tree fails here with its reason.
		if _, err := a.read("composer.json"); err != nil {
			return err
		}
		a.note("found composer.json: the dependencies install with composer, in a stage of their own (%s)", a.cfg.Images.Composer)
		if !hasLock {
			a.note("no composer.lock: composer resolves the dependencies at each build (commit composer.lock to build the same ones every time)")
		}
	} else {
		a.note("found index.php, and no composer.json: a PHP app without dependencies")
	}
	a.noteProcfile()

	// The document root: public/ when the app has one with a front controller
	// (Laravel, Symfony, Slim), else the app itself.
	docroot := "."
	for _, dir := range []string{"public", "web"} {
		if a.isFile(dir+"/index.php") || a.isFile(dir+"/index.html") {
			docroot = dir
			break
		}
	}
	if docroot == "." && !a.isFile("index.php") && len(a.procs) == 0 {
		return errors.New("no start command for this PHP app: add an index.php (in public/ or at the root), or a Procfile with a web process (web: php -S 0.0.0.0:$PORT -t public)")
	}
	desc := "php -S, document root " + docroot
	if docroot == "." {
		desc = "php -S, document root the app's own directory"
	}
	if _, hasWeb := a.web(); !hasWeb {
		a.note("start: %s (%s answers 404 for dotfiles and the app's own files)", desc, phpRouter)
	}

	d.header("a PHP app (found " + map[bool]string{true: "composer.json", false: "index.php"}[composer] + ")")
	d.blank()
	if composer {
		d.line("FROM %s AS vendor", a.cfg.Images.Composer)
		d.line("WORKDIR /app")
		sources := "composer.json"
		if hasLock {
			sources += " composer.lock"
		}
		d.comment(
			"The dependencies first, from "+strings.Replace(sources, " ", " and ", 1)+" only, in a layer of their own: it is",
			"cached until they change, instead of installing again at every change of the code.",
			"Without the development ones. Without scripts nor autoloader yet: both need the",
			"code. The platform (PHP's version and extensions) is the runtime image's, not this",
			"one's, so it is not checked here.",
		)
		d.line("COPY %s ./", sources)
		d.line("RUN composer install --no-dev --no-interaction --no-progress --prefer-dist \\\n    --no-scripts --no-autoloader --ignore-platform-reqs")
		d.comment("The code, then the autoloader, optimised, and the scripts that run with it.")
		d.line("COPY . .")
		d.line("RUN composer dump-autoload --no-dev --no-interaction --optimize")
		d.blank()
	}
	d.line("FROM %s", a.cfg.Images.PHP)
	d.line("WORKDIR /app")
	d.comment(
		"The app's files, owned by the user it runs as: it may write its caches and",
		"uploads into its tree, as on Heroku.",
	)
	if composer {
		d.line("COPY --from=vendor --chown=%s /app ./", nonRootUser)
	} else {
		d.line("COPY --chown=%s . .", nonRootUser)
	}
	d.comment(
		"The router of PHP's built-in server: it answers 404 for dotfiles (.env, .git) and,",
		"when the document root is the app itself, for Composer's files and vendor/; every",
		"other request is served as the server would.",
	)
	d.comment("/app itself too (WORKDIR made it root's): the app may add files at its top.")
	d.line("RUN chown %s /app", nonRootUser)
	d.line("COPY <<'EOF' %s", phpRouter)
	d.line("%s", phpRouterScript(docroot == "."))
	d.line("EOF")
	d.blank()
	d.comment("Not root: nobody, as a number, who owns the app's files.")
	d.line("USER %s", nonRootUser)
	portEnv(d, " \\\n    PHP_CLI_SERVER_WORKERS=4",
		"PHP's built-in server answers one request at a time unless it has workers: four.")
	a.startWithShell(d, []string{
		"PHP's built-in server on every interface at $PORT, with the router above.",
	}, []string{"sh", "-c", `exec php -S "0.0.0.0:${PORT:-` + DefaultPort + `}" -t ` + docroot + " " + phpRouter}, desc)
	return nil
}

// phpRouterScript is the router's PHP: true from a router ends the request (the
// 404 here), false lets the server serve the file or run the script as it would.
func phpRouterScript(rootIsApp bool) string {
	hidden := ""
	if rootIsApp {
		hidden = `
// The document root is the app itself: its Composer files, dependencies and
// platform files are not the site's.
if (preg_match('#^/(composer\.(json|lock)|vendor(/|$)|Procfile$|app\.json$)#', $path)) {
    return bex_not_found();
}`
	}
	return `<?php
// Written by bex: the router of PHP's built-in server for this app.
function bex_not_found() {
    http_response_code(404);
    header('Content-Type: text/plain');
    echo "Not Found\n";
    return true;
}
$path = rawurldecode(parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH) ?? '/');
// Dotfiles and dot-directories (.env, .git/), but for /.well-known/.
if (preg_match('#/\.(?!well-known(/|$))#', $path) || str_contains($path, "\0")) {
    return bex_not_found();
}` + hidden + `
// A file reached through a link that leads out of the document root.
$root = realpath($_SERVER['DOCUMENT_ROOT']);
$file = realpath($root . $path);
if ($file !== false && $file !== $root && !str_starts_with($file, $root . '/')) {
    return bex_not_found();
}
return false;`
}
