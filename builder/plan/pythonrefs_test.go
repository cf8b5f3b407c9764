package plan_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bex.co/bex/builder/plan"
)

// The files a requirements file refers to are copied with it, before the code, so
// that a change of the code does not install the dependencies again; anything
// that is not plainly a file or directory of the tree makes the install need the
// whole tree, as before.
func TestPythonRequirementsReferToFilesOfTheTree(t *testing.T) {
	for _, c := range []struct {
		name   string
		files  map[string]string
		links  map[string]string
		copies []string // the COPY lines before the install; nil: the install needs the tree
	}{
		{name: "a directory of wheels",
			files:  map[string]string{"requirements.txt": "--no-index\n--find-links ./wheels\ngreeting==1.0\n", "wheels/greeting-1.0-py3-none-any.whl": "w"},
			copies: []string{"COPY requirements.txt ./", "COPY wheels ./wheels"}},
		{name: "a chain of requirements files, each relative to its own directory",
			files: map[string]string{"requirements.txt": "-r reqs/base.txt\n", "reqs/base.txt": "-c constraints.txt\n-f ../wheels\nflask\n",
				"reqs/constraints.txt": "flask<4\n", "wheels/a.whl": "w"},
			copies: []string{"COPY requirements.txt ./", "COPY reqs/base.txt ./reqs/base.txt", "COPY reqs/constraints.txt ./reqs/constraints.txt", "COPY wheels ./wheels"}},
		{name: "the project itself",
			files: map[string]string{"requirements.txt": "-e .\n", "setup.py": ""}},
		{name: "a path above the tree",
			files: map[string]string{"requirements.txt": "-f ../../etc\n"}},
		{name: "an absolute path",
			files: map[string]string{"requirements.txt": "-r /etc/requirements.txt\n"}},
		{name: "a missing file",
			files: map[string]string{"requirements.txt": "-r base.txt\n"}},
		{name: "a link, even inside the tree",
			files: map[string]string{"requirements.txt": "-f ./wheels\n", "real/a.whl": "w"},
			links: map[string]string{"wheels": "real"}},
		{name: "a name COPY would read otherwise",
			files: map[string]string{"requirements.txt": "-f ./wh*ls\n", "wh*ls/a.whl": "w"}},
		{name: "a loop of requirements files",
			files: map[string]string{"requirements.txt": "-r a.txt\n", "a.txt": "-r b.txt\n", "b.txt": "-r a.txt\n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.files["main.py"] = "print('hi')\n"
			for name, content := range c.files {
				p := filepath.Join(dir, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for name, target := range c.links {
				if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			p, err := plan.Detect(os.DirFS(dir), plan.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(p.Dockerfile, "\n")
			install, code := -1, -1
			var copies []string
			for i, l := range lines {
				switch {
				case strings.HasPrefix(l, "RUN ") && strings.Contains(l, "pip install -r requirements.txt"):
					install = i
				case strings.HasPrefix(l, "COPY --chown=65534:65534 . ."):
					code = i
				case strings.HasPrefix(l, "COPY ") && code < 0:
					copies = append(copies, l)
				}
			}
			if install < 0 || code < 0 {
				t.Fatalf("no install or no copy of the code:\n%s", p.Dockerfile)
			}
			if c.copies == nil {
				if install < code || len(copies) > 0 {
					t.Fatalf("the install should come after the code, with nothing copied before:\n%s", p.Dockerfile)
				}
				return
			}
			if install > code || strings.Join(copies, "\n") != strings.Join(c.copies, "\n") {
				t.Fatalf("copied before the code: %q, want %q, install before the code: %v:\n%s", copies, c.copies, install < code, p.Dockerfile)
			}
		})
	}
}
