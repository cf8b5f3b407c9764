package plan

import (
	"errors"
	"fmt"

	"github.com/distribution/reference"
)

// Config holds the base images, so that production uses official images and tests use
// local ones.
type Config struct {
	Images Images
}

// Images are the base images of the generated Dockerfiles, as FROM references.
type Images struct {
	// Go is the builder image of a Go app: the toolchain that compiles the binary.
	Go string
	// Node is the image a Node app builds and runs on. It must have a `node` user, as
	// the official images do: the app runs as that user.
	Node string
	// Python is the image a Python app installs into and runs on.
	Python string
	// Static serves a static site: busybox, whose httpd serves a directory on a port.
	Static string
	// Runtime is the base a compiled Go binary runs on. The default is distroless
	// static: CA certificates, time zones and an /etc/passwd with nobody, and no shell
	// nor package manager, so the image holds little more than the app. Plans treat it
	// as having no shell whatever it is set to (see Plan.Shell).
	Runtime string
	// Stack is the base of an app that has only a Procfile: what Heroku's stack
	// image offers the commands of a Procfile (sh and bash, python3, perl, ruby,
	// curl, git, CA certificates, time zones and the common C libraries).
	Stack string
	// Ruby is the image a Ruby app installs its gems into (Bundler) and runs on. The
	// official images' layout is expected: gems in GEM_HOME, bundle on PATH.
	Ruby string
	// PHP is the image a PHP app runs on: php with its CLI server (php -S).
	PHP string
	// Composer installs a PHP app's dependencies (composer install) in a build
	// stage of its own, whose tree the PHP image then takes.
	Composer string
}

// DefaultConfig returns the official images that production builds use.
func DefaultConfig() Config {
	return Config{Images: Images{
		Go:     "golang:1.26-bookworm",
		Node:   "node:22-bookworm-slim",
		Python: "python:3.13-slim-bookworm",
		Static: "busybox:stable",
		// Not scratch: apps call HTTPS APIs and need CA certificates, and time
		// zones. Not the :nonroot tag: the Dockerfile sets its own user (65534).
		Runtime: "gcr.io/distroless/static-debian12",
		// The nearest official image to Heroku's stack: bookworm with curl, git
		// (and so perl), mercurial (and so python3), bash, CA certificates, time
		// zones and the common libraries, no compilers. It has no ruby: set
		// --plan-image-stack to an image with one where Procfiles need it (the
		// local stand-in has it).
		Stack: "buildpack-deps:bookworm-scm",
		// Bundler comes with the official Ruby image, and GEM_HOME is
		// /usr/local/bundle, where `bundle install` puts the gems as root.
		Ruby: "ruby:3.3-slim-bookworm",
		// The official PHP image runs the app; it has no Composer, and no unzip
		// nor zip extension for Composer's downloads, so Composer runs in its own
		// image (Composer's own advice) and the runtime image takes its tree.
		PHP:      "php:8.2-cli-bookworm",
		Composer: "composer:2",
	}}
}

// Validate reports every image that is unset or is not an image reference. A
// reference goes on a FROM line as is, so one that is not a reference could break or
// rewrite the Dockerfile.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, ref string }{
		{"Go", c.Images.Go},
		{"Node", c.Images.Node},
		{"Python", c.Images.Python},
		{"Static", c.Images.Static},
		{"Runtime", c.Images.Runtime},
		{"Stack", c.Images.Stack},
		{"Ruby", c.Images.Ruby},
		{"PHP", c.Images.PHP},
		{"Composer", c.Images.Composer},
	} {
		if f.ref == "" {
			errs = append(errs, fmt.Errorf("plan: Config.Images.%s is empty: set a base image such as %q", f.name, defaultImage(f.name)))
			continue
		}
		if _, err := reference.ParseNormalizedNamed(f.ref); err != nil {
			errs = append(errs, fmt.Errorf("plan: Config.Images.%s %q is not an image reference: %v", f.name, f.ref, err))
		}
	}
	return errors.Join(errs...)
}

func defaultImage(field string) string {
	im := DefaultConfig().Images
	return map[string]string{
		"Go": im.Go, "Node": im.Node, "Python": im.Python,
		"Static": im.Static, "Runtime": im.Runtime, "Stack": im.Stack,
		"Ruby": im.Ruby, "PHP": im.PHP, "Composer": im.Composer,
	}[field]
}
