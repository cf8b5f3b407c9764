package builder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
)

// The build directory and the Dockerfile path come from the App (spec.build) and
// name places in a tree the pusher wrote. They are resolved through the export's
// os.Root one component at a time, with Lstat: every component must be a real
// directory of the tree (the Dockerfile a regular file), so that a link in the
// repository never leads the build to a directory of the host, nor to another part
// of the tree than the one named.

// errNotInTree is why a build directory or Dockerfile is not there.
var errNotInTree = errors.New("not in the tree")

// cleanRel checks that rel is a relative path that stays in the tree, and returns its
// clean form ("." for the root).
func cleanRel(what, rel string) (string, error) {
	if rel == "" {
		return ".", nil
	}
	clean := path.Clean(strings.TrimSuffix(rel, "/"))
	if path.IsAbs(rel) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("%s %q leaves the repository; give a path inside it, such as web", what, rel)
	}
	return clean, nil
}

// realDirs checks that every component of the clean relative path p is a directory of
// root and not a link. what and given name the setting in the refusal, full is its
// clean form.
func realDirs(root *os.Root, what, given, full, p string) error {
	if p == "." {
		return nil
	}
	cur := ""
	for _, c := range strings.Split(p, "/") {
		cur = path.Join(cur, c)
		fi, err := root.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%w: %s", errNotInTree, cur)
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0 && cur == full:
			return fmt.Errorf("%s %q is a symbolic link; point the build at a real directory of the repository", what, given)
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s %q is below %q, a symbolic link; point the build at a real directory of the repository", what, given, cur)
		case !fi.IsDir():
			return fmt.Errorf("%w: %s is a file", errNotInTree, cur)
		}
	}
	return nil
}

// openBuildDir opens the build directory dir of the export as a root of its own.
func openBuildDir(src *os.Root, dir, commit string) (*os.Root, error) {
	clean, err := cleanRel("build directory", dir)
	if err != nil {
		return nil, err
	}
	if err := realDirs(src, "build directory", dir, clean, clean); err != nil {
		if errors.Is(err, errNotInTree) {
			return nil, fmt.Errorf("build directory %q is not a directory in commit %s", dir, commit)
		}
		return nil, err
	}
	// Every component was checked above, and the export is private to this build:
	// OpenRoot finds the same directory.
	return src.OpenRoot(clean)
}

// findDockerfile looks for the Dockerfile name inside the build directory ctx. It
// returns its directory and file name, or found false when there is none; a
// Dockerfile that is a link, is below one, or is not a regular file is refused.
func findDockerfile(ctx *os.Root, name string) (dir, file string, found bool, err error) {
	clean, err := cleanRel("Dockerfile", name)
	if err != nil {
		return "", "", false, err
	}
	if clean == "." {
		return "", "", false, fmt.Errorf("Dockerfile %q names the build directory, not a file", name)
	}
	dir, file = path.Split(clean)
	dir = path.Clean("./" + dir)
	if err := realDirs(ctx, "Dockerfile", name, clean, dir); err != nil {
		if errors.Is(err, errNotInTree) {
			return "", "", false, nil
		}
		// A link among the Dockerfile's directories: say it of the Dockerfile.
		return "", "", false, fmt.Errorf("Dockerfile %q is below a symbolic link; put the Dockerfile in a real directory of the repository", name)
	}
	fi, err := ctx.Lstat(clean)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", "", false, nil
	case err != nil:
		return "", "", false, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return "", "", false, fmt.Errorf("Dockerfile %q is a symbolic link; put the Dockerfile itself in the repository", name)
	case !fi.Mode().IsRegular():
		return "", "", false, fmt.Errorf("Dockerfile %q is not a regular file", name)
	}
	return dir, file, true, nil
}
