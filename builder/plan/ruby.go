package plan

import (
	"errors"
	"regexp"
	"strings"
)

// gemfile is what a plan needs of the Gemfile and Gemfile.lock.
type gemfile struct {
	gems     map[string]bool // the gems named by the Gemfile or locked by Gemfile.lock
	fromTree bool            // the Gemfile needs more of the tree (path:, gemspec, eval_gemfile)
	ruby     string          // the Ruby version the Gemfile asks for, if any
}

var (
	gemLine      = regexp.MustCompile(`(?m)^\s*gem\s*\(?\s*["']([A-Za-z0-9_.-]+)["']`)
	lockedGem    = regexp.MustCompile(`(?m)^    ([A-Za-z0-9_.-]+) \(`)
	gemfileRuby  = regexp.MustCompile(`(?m)^\s*ruby\s*\(?\s*["']([^"'\n]+)["']`)
	gemfileLocal = regexp.MustCompile(`(?m)^\s*(gemspec\b|eval_gemfile\b|gem\b.*\bpath\s*(:|=>))|^\s*path\b`)
)

// parseGemfile reads the gems of a Gemfile and of its lock (which also names the gems
// that the Gemfile's gems depend on: rails through a meta-gem is found there).
func parseGemfile(gemfileData, lock []byte) gemfile {
	g := gemfile{gems: map[string]bool{}}
	for _, m := range gemLine.FindAllSubmatch(gemfileData, -1) {
		g.gems[string(m[1])] = true
	}
	for _, m := range lockedGem.FindAllSubmatch(lock, -1) {
		g.gems[string(m[1])] = true
	}
	if m := gemfileRuby.FindSubmatch(gemfileData); m != nil {
		g.ruby = string(m[1])
	}
	g.fromTree = gemfileLocal.Match(gemfileData)
	return g
}

// rubyPlan installs the gems with Bundler as root and runs the app as nobody, in
// production, as Heroku's Ruby buildpack sets it up.
func (a *app) rubyPlan(d *dockerfile) error {
	data, err := a.read("Gemfile")
	if err != nil {
		return err
	}
	hasLock := a.isFile("Gemfile.lock")
	var lock []byte
	if hasLock {
		if lock, err = a.read("Gemfile.lock"); err != nil {
			return err
		}
	}
	g := parseGemfile(data, lock)
	vendored := a.isDir("vendor/cache")
	rails := g.gems["rails"] || g.gems["railties"]
	switch {
	case rails:
		a.note("found Gemfile, with rails: a Rails app")
	case a.isFile("config.ru"):
		a.note("found Gemfile and config.ru: a Rack app")
	default:
		a.note("found Gemfile")
	}
	if !hasLock {
		a.note("no Gemfile.lock: Bundler resolves the gems at each build (commit Gemfile.lock to build the same gems every time)")
	}
	if vendored {
		a.note("found vendor/cache: the gems install from it and from the image, with no download (bundle install --local)")
	}
	if g.ruby != "" {
		a.note("the Gemfile asks for ruby %s; the image is %s", g.ruby, a.cfg.Images.Ruby)
	}
	a.noteProcfile()

	// The start command: Rails' server for a Rails app, else the Rack app of
	// config.ru with puma when the bundle has it (its config/puma.rb applies), else
	// rackup. bundle exec, so that the app sees its bundle's gems and no others.
	port := `"${PORT:-` + DefaultPort + `}"`
	var start, why []string
	var desc string
	switch {
	case rails && a.isFile("config.ru"):
		start = []string{"sh", "-c", "exec bundle exec rails server -b 0.0.0.0 -p " + port}
		why = []string{"Rails' server, on every interface at $PORT."}
		desc = "bundle exec rails server"
	case a.isFile("config.ru") && g.gems["puma"]:
		start = []string{"sh", "-c", "exec bundle exec puma -b tcp://0.0.0.0:" + strings.Trim(port, `"`) + " config.ru"}
		why = []string{"The Rack app of config.ru, served by puma (in the bundle) on every interface at $PORT."}
		desc = "bundle exec puma config.ru"
	case a.isFile("config.ru"):
		start = []string{"sh", "-c", "exec bundle exec rackup -o 0.0.0.0 -p " + port + " config.ru"}
		why = []string{"The Rack app of config.ru, served by rackup on every interface at $PORT."}
		desc = "bundle exec rackup config.ru"
	case len(a.procs) == 0:
		return errors.New("no start command for this Ruby app: add a Procfile with a web process (web: bundle exec ruby app.rb), or a config.ru")
	}
	if _, hasWeb := a.web(); desc != "" && !hasWeb {
		a.note("start: %s", desc)
	}

	d.header("a Ruby app (found Gemfile)")
	d.blank()
	d.line("FROM %s", a.cfg.Images.Ruby)
	d.comment(
		"Production, as Heroku's Ruby buildpack sets it: Rack and Rails in production mode,",
		"Rails' log to the output and its static files (public/) served by the app itself,",
		"no development nor test gems.",
	)
	env := "ENV RACK_ENV=production \\\n    RAILS_ENV=production \\\n    RAILS_LOG_TO_STDOUT=enabled \\\n    RAILS_SERVE_STATIC_FILES=enabled \\\n    BUNDLE_WITHOUT=development:test"
	if hasLock {
		env += " \\\n    BUNDLE_FROZEN=true"
		d.comment("Gemfile.lock is the truth: Bundler refuses to change it (BUNDLE_FROZEN).")
	}
	d.line("%s", env)
	d.line("WORKDIR /app")
	install := "bundle install"
	if vendored {
		install += " --local --no-cache"
	}
	gemSources := []string{"Gemfile"}
	if hasLock {
		gemSources = append(gemSources, "Gemfile.lock")
	}
	installComment := func() {
		d.comment(
			"The gems install as root into the image's GEM_HOME (/usr/local/bundle), beside the",
			"gems the image has, which bundle exec finds there too.",
		)
		if vendored {
			d.comment(
				"--local: from vendor/cache (bundle cache) and the image's own gems only, with no",
				"download from RubyGems; --no-cache: vendor/cache stays as the app has it (Bundler",
				"would add the image's gems to it, and fail on those that have no .gem file).",
			)
		}
	}
	if g.fromTree {
		a.note("the Gemfile refers to files of the app (path:, gemspec): the gems are installed with the code, not in a layer of their own")
		d.comment(
			"The code, owned by the user the app runs as, and the gems with it: the Gemfile",
			"refers to files of the app (path:, gemspec), so any change of the code installs",
			"them again.",
		)
		d.line("COPY --chown=%s . .", nonRootUser)
		installComment()
		d.line("RUN %s", install)
	} else {
		d.comment(
			"The gems first, from "+strings.Join(gemSources, " and ")+" only, in a layer of their own: it is",
			"cached until they change, instead of installing again at every change of the code.",
		)
		d.line("COPY %s ./", strings.Join(gemSources, " "))
		if vendored {
			d.line("COPY vendor/cache ./vendor/cache")
		}
		installComment()
		d.line("RUN %s", install)
		d.comment(
			"The app's files, owned by the user it runs as: Rails writes tmp/ and log/, and a",
			"release command may write into the tree, as on Heroku.",
		)
		d.line("COPY --chown=%s . .", nonRootUser)
	}
	d.comment("/app itself too (WORKDIR made it root's): the app may add files at its top.")
	d.line("RUN chown %s /app", nonRootUser)
	d.blank()
	d.comment("Not root: nobody, as a number, who owns the app's files.")
	d.line("USER %s", nonRootUser)
	if rails && a.isFile("Rakefile") {
		d.comment(
			"Rails' assets, compiled as Heroku does when the app has the task (an API-only app",
			"has none), as the app's user, who then owns them and their cache in tmp/. Rails",
			"loads its production config to compile: it gets a secret key that is used for this",
			"step only and is not kept in the image.",
		)
		d.line(`RUN export SECRET_KEY_BASE=assets-precompile-only && tasks="$(bundle exec rake -P)" && \` + "\n" +
			`    if printf '%%s\n' "$tasks" | grep -qx "rake assets:precompile"; then \` + "\n" +
			`        bundle exec rake assets:precompile; \` + "\n" +
			`    fi`)
		a.note("assets: bundle exec rake assets:precompile, when the app has the task")
	}
	if rails {
		a.note("Rails needs SECRET_KEY_BASE (or RAILS_MASTER_KEY) at run time, which the image does not hold: set it with config:set APP SECRET_KEY_BASE=..., or in app.json's env with \"generator\": \"secret\", as Heroku's Rails apps do")
	}
	portEnv(d, "")
	a.startWithShell(d, why, start, desc)
	return nil
}
