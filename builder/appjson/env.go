package appjson

import (
	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// MaxEnvVars is the App API's bound on spec.env.
const MaxEnvVars = 500

// GeneratorSecret is the one generator of Heroku's schema (and Dokku's): a
// secret made when the var is set, 64 hex digits from a secure source.
const GeneratorSecret = "secret"

// EnvVar is one config var of app.json's env, Heroku's schema: a string (its
// value) or {"description", "value", "required", "generator"}. bex sets it on
// the app's first deploy, where the app does not set it already, and refuses
// a push while a required one is not set.
type EnvVar struct {
	Name string
	// Value is set on the first deploy; "" without one (a var the user sets).
	Value string
	// HasValue tells an empty value given ("value": "") from none.
	HasValue bool
	// Generator is GeneratorSecret or "".
	Generator string
	// Required is the schema's required, true unless the file says false.
	Required bool
}

// Sets says whether the var is set on a first deploy: it has a value or a
// generator.
func (e EnvVar) Sets() bool { return e.HasValue || e.Generator != "" }

// MissingEnv returns the names of the config vars f requires that isSet says
// are not set, in name order (Env's). On the app's first deploy (first), a var that
// app.json gives a value or a generator is not missing: it is about to be set.
// On a later one it is, when someone unset it since: app.json's values apply
// once, and a value already there is the app's to keep.
func (f *File) MissingEnv(isSet func(name string) bool, first bool) []string {
	var out []string
	for _, e := range f.Env {
		if !e.Required || isSet(e.Name) || first && e.Sets() {
			continue
		}
		out = append(out, e.Name)
	}
	return out
}

// env: {"NAME": "value", "OTHER": {"description": "...", "value": "...",
// "required": false, "generator": "secret"}}.
func (p *parser) env(v any) error {
	m, err := p.object("env", v)
	if err != nil {
		return err
	}
	if len(m) > MaxEnvVars {
		return p.errorf("env", "has %d config vars, and an app has at most %d", len(m), MaxEnvVars)
	}
	for _, name := range sortedKeys(m) {
		path := join("env", name)
		if !appv1.ValidEnvName(name) {
			return p.errorf(path, "%s is not a config var name: use letters, digits and '_', not starting with a digit (as a shell variable)", show(name))
		}
		e := EnvVar{Name: name, Required: true}
		switch v := m[name].(type) {
		case string:
			e.Value, e.HasValue = v, true
		case map[string]any:
			for _, k := range sortedKeys(v) {
				kv := v[k]
				switch k {
				case "description":
					if _, ok := kv.(string); !ok {
						return p.errorf(path+".description", "is %s, and it should be a string", kind(kv))
					}
				case "value":
					s, ok := kv.(string)
					if !ok {
						return p.errorf(path+".value", "is %s, and a value is a string: write it in quotes, such as \"5\"", kind(kv))
					}
					e.Value, e.HasValue = s, true
				case "required":
					b, ok := kv.(bool)
					if !ok {
						return p.errorf(path+".required", "is %s, and it should be true or false", kind(kv))
					}
					e.Required = b
				case "generator":
					if kv != GeneratorSecret {
						return p.errorf(path+".generator", "%s is not a generator: bex knows \"secret\" (64 random hex digits)", show(kv))
					}
					e.Generator = GeneratorSecret
				default:
					p.warn("%s.%s is ignored: bex reads description, value, required and generator (values apply on the first deploy only)", path, k)
				}
			}
		default:
			return p.errorf(path, "is %s, and it should be a value (a string) or an object such as {\"value\": \"5\", \"required\": false}", kind(m[name]))
		}
		if len(e.Value) > appv1.MaxEnvValueBytes {
			return p.errorf(path, "the value is %d bytes; at most %d fit", len(e.Value), appv1.MaxEnvValueBytes)
		}
		if e.HasValue && e.Generator != "" {
			p.warn("%s.value is ignored: the generator makes the value", path)
			e.Value, e.HasValue = "", false
		}
		p.file.Env = append(p.file.Env, e)
	}
	return nil
}
