package appjson

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEnv reads env as Heroku's schema writes it: a string is a value, an
// object has value, required (true unless false) and generator "secret".
func TestEnv(t *testing.T) {
	f, err := Parse([]byte(`{
  // Dokku's and Heroku's forms
  "env": {
    "SIMPLE": "default",
    "SECRET_KEY": {"description": "signs cookies", "generator": "secret"},
    "DATABASE_URL": {"description": "PostgreSQL", "required": true},
    "OPTIONAL": {"value": "x", "required": false},
    "EMPTY": {"value": ""},
    "SYNCED": {"value": "s", "sync": true},
    "BOTH": {"value": "ignored", "generator": "secret"},
  },
}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []EnvVar{
		{Name: "BOTH", Generator: GeneratorSecret, Required: true},
		{Name: "DATABASE_URL", Required: true},
		{Name: "EMPTY", HasValue: true, Required: true},
		{Name: "OPTIONAL", Value: "x", HasValue: true},
		{Name: "SECRET_KEY", Generator: GeneratorSecret, Required: true},
		{Name: "SIMPLE", Value: "default", HasValue: true, Required: true},
		{Name: "SYNCED", Value: "s", HasValue: true, Required: true},
	}
	if !slices.Equal(f.Env, want) {
		t.Errorf("env\n%+v\nwant\n%+v", f.Env, want)
	}
	all := strings.Join(f.Warnings, "\n")
	for _, w := range []string{"env.SYNCED.sync is ignored", "env.BOTH.value is ignored: the generator makes the value"} {
		if !strings.Contains(all, w) {
			t.Errorf("no warning %q in:\n%s", w, all)
		}
	}

	set := map[string]bool{}
	isSet := func(n string) bool { return set[n] }
	// A first deploy: what app.json gives a value or a generator is about to be
	// set; a required var without either is missing.
	if got := f.MissingEnv(isSet, true); !slices.Equal(got, []string{"DATABASE_URL"}) {
		t.Errorf("missing on a first deploy: %v", got)
	}
	// A later deploy: whatever is required and not set is missing, the app's
	// own choice to unset a default included; optional ones never are.
	if got := f.MissingEnv(isSet, false); !slices.Equal(got, []string{"BOTH", "DATABASE_URL", "EMPTY", "SECRET_KEY", "SIMPLE", "SYNCED"}) {
		t.Errorf("missing on a later deploy: %v", got)
	}
	for _, n := range []string{"BOTH", "DATABASE_URL", "EMPTY", "SECRET_KEY", "SIMPLE", "SYNCED"} {
		set[n] = true
	}
	if got := f.MissingEnv(isSet, false); len(got) != 0 {
		t.Errorf("missing with all set: %v", got)
	}
}

// TestEnvErrors: a bad env is one line naming the key, with the bounds of
// config:set.
func TestEnvErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"env": []}`, `app.json line 1: env: is a list, and it should be an object`},
		{`{"env": {"1BAD": "x"}}`, `app.json line 1: env.1BAD: "1BAD" is not a config var name: use letters, digits and '_'`},
		{`{"env": {"A-B": "x"}}`, `env.A-B: "A-B" is not a config var name`},
		{"{\"env\": {\n \"N\": 5}}", `app.json line 2: env.N: is a number, and it should be a value (a string) or an object`},
		{`{"env": {"N": {"value": 5}}}`, `env.N.value: is a number, and a value is a string: write it in quotes, such as "5"`},
		{`{"env": {"N": {"required": "yes"}}}`, `env.N.required: is a string, and it should be true or false`},
		{`{"env": {"N": {"generator": "echo 5"}}}`, `env.N.generator: "echo 5" is not a generator: bex knows "secret"`},
		{`{"env": {"N": {"description": 1}}}`, `env.N.description: is a number, and it should be a string`},
		{`{"env": {"N": "` + strings.Repeat("v", 32769) + `"}}`, `env.N: the value is 32769 bytes; at most 32768 fit`},
	} {
		_, err := Parse([]byte(c.in))
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60s: %v, want %q", c.in, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%.60s: more than one line: %q", c.in, err)
		}
	}
	var b strings.Builder
	b.WriteString(`{"env": {`)
	for i := 0; i <= MaxEnvVars; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"V_` + strconv.Itoa(i) + `": "1"`)
	}
	b.WriteString(`}}`)
	if _, err := Parse([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "env: has 501 config vars, and an app has at most 500") {
		t.Errorf("501 vars: %v", err)
	}
}
