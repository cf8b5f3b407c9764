package gitserver_test

import (
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"bex.co/bex/gitserver"
)

func TestSplitCommand(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"   ", nil},
		{"apps:list --json", []string{"apps:list", "--json"}},
		{"git-receive-pack '/app.git'", []string{"git-receive-pack", "/app.git"}},
		{"config:set app 'K=a b;$(x)'", []string{"config:set", "app", "K=a b;$(x)"}},
		{`config:set app "K=a \"b\" \$HOME \\ \x"`, []string{"config:set", "app", `K=a "b" $HOME \ \x`}},
		{`config:set app K=a\ b`, []string{"config:set", "app", "K=a b"}},
		{"a 'it'\\''s' b", []string{"a", "it's", "b"}},
		{"keys:add '' x", []string{"keys:add", "", "x"}},
		{`a "" b`, []string{"a", "", "b"}},
		{"a\tb\nc", []string{"a", "b", "c"}},
		{"a\\\nb", []string{"ab"}},
		{`a b\`, []string{"a", `b\`}},
		{"x; rm -rf / | y && `z` > f", []string{"x;", "rm", "-rf", "/", "|", "y", "&&", "`z`", ">", "f"}},
		{"k='multi\nline' ~ * $HOME", []string{"k=multi\nline", "~", "*", "$HOME"}},
		{"config:set é 'K=ü 😀'", []string{"config:set", "é", "K=ü 😀"}},
	} {
		got, err := gitserver.SplitCommand(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("SplitCommand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a 'b", `a "b`, `"a\"`} {
		if got, err := gitserver.SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%q) = %q, want an error", bad, got)
		}
	}
}

// TestSplitCommandAgreesWithSh compares SplitCommand with /bin/sh's own word
// splitting, on random commands made of quotes, backslashes, blanks and letters.
// Left out: $, ` and globs, which the shell expands and bex keeps as they are, and
// the operators (; | newline) that end a shell command where bex sees a character
// or a blank.
func TestSplitCommandAgreesWithSh(t *testing.T) {
	alphabet := []string{"a", "b", " ", "\t", "'", `"`, `\`, "é", "="}
	rnd := rand.New(rand.NewPCG(1, 2))
	compared := 0
	for i := 0; i < 400; i++ {
		var b strings.Builder
		for n := rnd.IntN(12); n >= 0; n-- {
			b.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		in := b.String()
		got, err := gitserver.SplitCommand(in)
		out, shErr := exec.Command("sh", "-c", `eval "set -- $1" && for a; do printf '%s\0' "$a"; done`, "sh", in).Output()
		if (err != nil) != (shErr != nil) {
			t.Errorf("SplitCommand(%q): error %v, sh's error %v", in, err, shErr)
			continue
		}
		if err != nil {
			continue
		}
		var want []string
		if len(out) > 0 {
			want = strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		}
		if !slices.Equal(got, want) {
			t.Errorf("SplitCommand(%q) = %q; sh says %q", in, got, want)
		}
		compared++
	}
	if compared < 100 {
		t.Fatalf("only %d commands compared", compared)
	}
}
