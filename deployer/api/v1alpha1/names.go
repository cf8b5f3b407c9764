package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"
)

// The name rules of the API, in one place for every component: the gitserver's
// paths and commands, the webhook paths, the runtimes' generated names. The CRD's
// validation says the same in OpenAPI.

// MaxAppNameLength is the longest app name. An app's name becomes a DNS label under
// the base domain, a Kubernetes label value and part of generated names (Release
// "<app>-v<n>", containers, Deployments), so it is kept well inside 63 characters.
const MaxAppNameLength = 40

// AppNameRule says what an app name may be, for messages that tell the user.
const AppNameRule = "1 to 40 lower-case letters, digits and '-', starting and ending with a letter or digit"

var appNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidAppName reports whether name can be an app's name (AppNameRule).
func ValidAppName(name string) bool {
	return len(name) <= MaxAppNameLength && appNameRE.MatchString(name)
}

// CheckAppName returns an error that says the rule when name cannot be an app's.
func CheckAppName(name string) error {
	if !ValidAppName(name) {
		return fmt.Errorf("%q is not an app name: use %s", name, AppNameRule)
	}
	return nil
}

// MaxUserNameLength and MaxKeyNameLength bound the names of Users and of their keys.
const (
	MaxUserNameLength = 63
	MaxKeyNameLength  = 63
)

var (
	userNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	keyNameRE  = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.@]*$`)
)

// ValidUserName reports whether name can be a User's name: a DNS-1123 label
// (lower-case letters, digits and '-', starting and ending with a letter or digit).
func ValidUserName(name string) bool {
	return len(name) <= MaxUserNameLength && userNameRE.MatchString(name)
}

// ValidKeyName reports whether name can name an SSH key of a User: letters, digits
// and - _ . @, starting with a letter or digit, at most 63.
func ValidKeyName(name string) bool {
	return len(name) <= MaxKeyNameLength && keyNameRE.MatchString(name)
}

// MaxEnvNameLength and MaxEnvValueBytes bound a config var.
const (
	MaxEnvNameLength = 256
	MaxEnvValueBytes = 32768
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether name can be a config var's name: a shell variable's.
func ValidEnvName(name string) bool {
	return len(name) <= MaxEnvNameLength && envNameRE.MatchString(name)
}

// Labels and annotations bex writes on objects, shared by the components that
// write them and those that select by them.
const (
	// LabelApp names the app an object belongs to (Releases, Secrets, Deployments,
	// containers).
	LabelApp = "app.bex.co/app"
	// LabelProcess names the process type of a workload.
	LabelProcess = "app.bex.co/process"
	// LabelRelease is the release number a workload runs.
	LabelRelease = "app.bex.co/release"
	// LabelSecret says what a bex Secret holds ("webhook", "token").
	LabelSecret = "app.bex.co/secret"
	// AnnotationReleaseFailed on a Release says why it never served (its rollout
	// failed and it was withdrawn).
	AnnotationReleaseFailed = "app.bex.co/failed"
	// AnnotationAppJSON on an App is what the last push's app.json set (JSON:
	// formation and healthCheck), so that the next push changes only what was not
	// set through the API since (ps:scale wins over app.json, as kubectl's
	// last-applied configuration lets a later edit win).
	AnnotationAppJSON = "app.bex.co/app-json"
	// AnnotationServedBefore on a Release is the number of the release that
	// served when it was recorded ("0": none had served), the one the App goes
	// back to when the release's postdeploy script fails after it came to serve.
	AnnotationServedBefore = "app.bex.co/served-before"
	// AnnotationFirstPostdeploy on an App is the release ("v3") whose first
	// postdeploy script (app.json's scripts.postdeploy) succeeded: it runs no
	// more once this is set.
	AnnotationFirstPostdeploy = "app.bex.co/first-postdeploy"
	// LabelOneOff marks a one-off instance (run, release, postdeploy, cron) with
	// its id; LabelProcess says which kind ("run.<id>", "release", "cron.<job>").
	LabelOneOff = "app.bex.co/one-off"
)

// VolumeNameRule says what a volume's name may be.
const VolumeNameRule = "1 to 30 lower-case letters, digits and '-', starting with a letter and not ending with '-'"

var volumeNameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

// ValidVolumeName reports whether name can name a volume (VolumeNameRule): it
// becomes a file name on the host, so nothing else.
func ValidVolumeName(name string) bool {
	return len(name) <= 30 && volumeNameRE.MatchString(name)
}

var volumePathRE = regexp.MustCompile(`^(/[A-Za-z0-9_@+-][A-Za-z0-9._@+-]*)+$`)

// CheckVolumePath returns an error that says the rule when p cannot be where a
// volume is mounted: an absolute, clean path of at most 255 characters, without
// '.' or '..' segments, not / and not /proc, /sys, /dev or under them (the
// kernel's and the runtime's own mounts).
func CheckVolumePath(p string) error {
	if len(p) > 255 || !volumePathRE.MatchString(p) {
		return fmt.Errorf("%q is not a mount path: use an absolute path such as /data (letters, digits and . _ @ + -, no trailing /)", p)
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("%q is not a mount path: no '.' or '..' segments", p)
		}
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if p == sys || strings.HasPrefix(p, sys+"/") {
			return fmt.Errorf("%q is not a mount path: %s belongs to the kernel", p, sys)
		}
	}
	return nil
}
