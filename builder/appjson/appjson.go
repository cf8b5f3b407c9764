package appjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/robfig/cron/v3"
	"github.com/tailscale/hujson"

	"bex.co/bex/builder/plan"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Bounds of what is read.
const (
	// MaxSize is the largest app.json read; a larger one fails the build.
	MaxSize = 64 << 10
	// MaxCronJobs is the App API's bound on spec.cron.
	MaxCronJobs = 50
	// MaxCommandSize bounds one command (the API's bound on a cron command).
	MaxCommandSize = 4096
	// MaxScheduleSize bounds one schedule.
	MaxScheduleSize = 128
	// MaxReplicas is the App API's bound on a process type's replicas.
	MaxReplicas = 100
	// MaxBootTimeout is the API's bound on bootTimeoutSeconds.
	MaxBootTimeout = 900
	// maxWarnings bounds the warning lines of one file.
	maxWarnings = 20
)

// Dokku's defaults for a check's settings.
const (
	DefaultTimeout  = 5
	DefaultAttempts = 3
	DefaultWait     = 5
)

// File is what bex uses of an app.json.
type File struct {
	// Formation maps process types to their quantity (replicas).
	Formation map[string]int32
	// HealthCheck is the web process's startup check; nil without one.
	HealthCheck *appv1.HealthCheck
	// Cron are the scheduled jobs, in the file's order.
	Cron []appv1.CronJob
	// Predeploy is scripts.dokku.predeploy as written: the last build step of
	// the image, its changes kept in it.
	Predeploy string
	// Postdeploy is scripts.dokku.postdeploy as written: it runs after each
	// deploy, once the new release serves.
	Postdeploy string
	// FirstPostdeploy is Heroku's scripts.postdeploy as written: it runs once,
	// after the app's first deploy that serves.
	FirstPostdeploy string
	// Env are the config vars of env, by name (env.go).
	Env []EnvVar
	// Warnings are one line each, about what the file sets that bex does not apply.
	Warnings []string
}

// parser holds the offsets of each value by path, for line numbers.
type parser struct {
	data    []byte
	offsets map[string]int64
	file    *File
}

// Error is an invalid app.json: Line (1-based; 0 when unknown) and Field (a path
// such as cron[0].schedule; empty for a syntax error).
type Error struct {
	Line  int
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("app.json")
	if e.Line > 0 {
		fmt.Fprintf(&b, " line %d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Parse reads an app.json. An invalid one is an *Error.
func Parse(data []byte) (*File, error) {
	if len(data) > MaxSize {
		return nil, &Error{Msg: fmt.Sprintf("the file is %d bytes, and bex reads at most %d: keep app.json small", len(data), MaxSize)}
	}
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	// JSONC, as Dokku reads app.json since 0.38: comments and trailing commas
	// become blanks, so every offset, and every line an error names, stays.
	std, err := hujson.Standardize(bytes.Clone(data))
	if err != nil {
		return nil, jsoncError(err)
	}
	data = std
	p := &parser{data: data, offsets: map[string]int64{}, file: &File{}}
	if err := p.index(); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return nil, &Error{Msg: "not JSON: " + err.Error()}
	}
	top, ok := root.(map[string]any)
	if !ok {
		return nil, p.errorf("", "app.json is a JSON object, such as {\"cron\": [...]}")
	}
	keys := sortedKeys(top)
	for _, k := range keys {
		v := top[k]
		var err error
		switch k {
		case "formation":
			err = p.formation(v)
		case "healthchecks":
			err = p.healthchecks(v)
		case "cron":
			err = p.cron(v)
		case "scripts":
			err = p.scripts(v)
		case "env":
			err = p.env(v)
		default:
			p.warn("%q is ignored: bex does not read it", k)
		}
		if err != nil {
			return nil, err
		}
	}
	return p.file, nil
}

// hujsonPosition is how hujson names where its parse failed.
var hujsonPosition = regexp.MustCompile(`^hujson: line (\d+), column \d+: (.*)$`)

// jsoncError is a syntax error of hujson's as an *Error with its line.
func jsoncError(err error) *Error {
	m := hujsonPosition.FindStringSubmatch(err.Error())
	if m == nil {
		return &Error{Msg: "not JSON: " + err.Error()}
	}
	line, _ := strconv.Atoi(m[1])
	// "parsing object after value: unexpected EOF" says no more than its end.
	msg := m[2]
	if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "parsing ") && i > 0 {
		msg = msg[i+2:]
	}
	msg = strings.NewReplacer("unexpected EOF", "unexpected end of the file",
		"after top-level value", "after the end of the object (text after the end)").Replace(msg)
	return &Error{Line: line, Msg: "not JSON: " + msg}
}

// index walks the tokens once, noting where each value starts; a syntax error
// names its line.
func (p *parser) index() error {
	dec := json.NewDecoder(bytes.NewReader(p.data))
	dec.UseNumber()
	var walk func(path string, depth int) error
	walk = func(path string, depth int) error {
		if depth > 32 {
			return p.errorf(path, "nested too deeply")
		}
		tok, err := dec.Token()
		if err != nil {
			return p.syntax(err, dec.InputOffset())
		}
		if _, seen := p.offsets[path]; !seen {
			p.offsets[path] = dec.InputOffset() - 1
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return p.syntax(err, dec.InputOffset())
				}
				key, _ := k.(string)
				if err := walk(join(path, key), depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return p.syntax(err, dec.InputOffset())
			}
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return p.syntax(err, dec.InputOffset())
			}
		}
		return nil
	}
	if err := walk("", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return &Error{Line: p.line(dec.InputOffset()), Msg: "not JSON: text after the end of the object"}
	}
	return nil
}

func (p *parser) syntax(err error, off int64) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off = se.Offset
	}
	msg := err.Error()
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		msg = "unexpected end of the file"
		off = int64(len(p.data))
	}
	return &Error{Line: p.line(off), Msg: "not JSON: " + msg}
}

func (p *parser) line(off int64) int {
	if off < 0 {
		off = 0
	}
	if off > int64(len(p.data)) {
		off = int64(len(p.data))
	}
	return bytes.Count(p.data[:off], []byte("\n")) + 1
}

func join(path, key string) string {
	if !simpleKey(key) {
		key = strconv.Quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func simpleKey(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (p *parser) errorf(path, format string, args ...any) error {
	line := 0
	if off, ok := p.offsets[path]; ok {
		line = p.line(off)
	}
	return &Error{Line: line, Field: path, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) warn(format string, args ...any) {
	if len(p.file.Warnings) < maxWarnings {
		p.file.Warnings = append(p.file.Warnings, "app.json: "+fmt.Sprintf(format, args...))
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (p *parser) object(path string, v any) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, p.errorf(path, "is %s, and it should be an object", kind(v))
	}
	return m, nil
}

func (p *parser) integer(path string, v any, lo, hi int64) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, p.errorf(path, "is %s, and it should be a whole number", kind(v))
	}
	i, err := n.Int64()
	if err != nil {
		return 0, p.errorf(path, "%s is not a whole number", n)
	}
	if i < lo || i > hi {
		return 0, p.errorf(path, "%d is out of range: use %d to %d", i, lo, hi)
	}
	return i, nil
}

func (p *parser) command(path string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", p.errorf(path, "is %s, and it should be a command (a string)", kind(v))
	}
	switch {
	case strings.TrimSpace(s) == "":
		return "", p.errorf(path, "is empty: give a command, such as \"./migrate\"")
	case len(s) > MaxCommandSize:
		return "", p.errorf(path, "is %d bytes long, and a command is at most %d", len(s), MaxCommandSize)
	case strings.ContainsAny(s, "\n\r\x00"):
		return "", p.errorf(path, "is more than one line: a command is one line, as in a Procfile (put a longer one in a script)")
	}
	return strings.TrimSpace(s), nil
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return "a value"
}

// formation: {"web": {"quantity": 2, "size": "..."}}.
func (p *parser) formation(v any) error {
	m, err := p.object("formation", v)
	if err != nil {
		return err
	}
	if len(m) > 20 {
		return p.errorf("formation", "has %d process types, and an app has at most 20", len(m))
	}
	p.file.Formation = map[string]int32{}
	for _, name := range sortedKeys(m) {
		path := join("formation", name)
		if !plan.ValidProcessName(name) {
			return p.errorf(path, "%q is not a process type name: use lower-case letters, digits and '-', starting with a letter (web, worker)", name)
		}
		f, err := p.object(path, m[name])
		if err != nil {
			return err
		}
		for _, k := range sortedKeys(f) {
			switch k {
			case "quantity":
				q, err := p.integer(path+".quantity", f[k], 0, MaxReplicas)
				if err != nil {
					return err
				}
				p.file.Formation[name] = int32(q)
			default:
				p.warn("%s.%s is ignored: bex reads only quantity (ps:resources sets limits)", path, k)
			}
		}
	}
	return nil
}

// healthchecks: {"web": [{"type": "startup", "path": "/health", ...}]}.
func (p *parser) healthchecks(v any) error {
	m, err := p.object("healthchecks", v)
	if err != nil {
		return err
	}
	for _, name := range sortedKeys(m) {
		path := join("healthchecks", name)
		list, ok := m[name].([]any)
		if !ok {
			return p.errorf(path, "is %s, and it should be a list of checks", kind(m[name]))
		}
		if len(list) > 20 {
			return p.errorf(path, "has %d checks, and bex reads at most 20", len(list))
		}
		for i, c := range list {
			cpath := fmt.Sprintf("%s[%d]", path, i)
			check, err := p.object(cpath, c)
			if err != nil {
				return err
			}
			typ := "startup"
			if t, ok := check["type"]; ok {
				s, ok := t.(string)
				if !ok {
					return p.errorf(cpath+".type", "is %s, and it should be startup, liveness or readiness", kind(t))
				}
				typ = s
			}
			if name != "web" || typ != "startup" {
				p.warn("%s is ignored: bex applies the web process's startup check only", cpath)
				continue
			}
			if p.file.HealthCheck != nil {
				p.warn("%s is ignored: bex applies one startup check of web, the first", cpath)
				continue
			}
			if err := p.check(cpath, check); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *parser) check(path string, c map[string]any) error {
	timeout, attempts, wait, delay := int64(DefaultTimeout), int64(DefaultAttempts), int64(DefaultWait), int64(0)
	hc := &appv1.HealthCheck{}
	var err error
	for _, k := range sortedKeys(c) {
		v := c[k]
		switch k {
		case "type", "name":
		case "path":
			s, ok := v.(string)
			if !ok || !strings.HasPrefix(s, "/") || len(s) > 1024 || strings.ContainsAny(s, " \t\r\n\x00") {
				return p.errorf(path+".path", "%s is not a path: use one such as \"/health\" (at most 1024 characters, no spaces)", show(v))
			}
			hc.Path = s
		case "timeout":
			if timeout, err = p.integer(path+"."+k, v, 1, 300); err != nil {
				return err
			}
		case "attempts":
			if attempts, err = p.integer(path+"."+k, v, 1, 100); err != nil {
				return err
			}
		case "wait":
			if wait, err = p.integer(path+"."+k, v, 0, 900); err != nil {
				return err
			}
		case "initialDelay":
			if delay, err = p.integer(path+"."+k, v, 0, 900); err != nil {
				return err
			}
		default:
			p.warn("%s.%s is ignored: bex checks that the path answers 2xx or 3xx", path, k)
		}
	}
	if hc.Path == "" {
		p.warn("%s is ignored: it has no path, and bex checks a path", path)
		return nil
	}
	boot := delay + attempts*(timeout+wait)
	if boot > MaxBootTimeout {
		boot = MaxBootTimeout
	}
	if boot < 1 {
		boot = 1
	}
	hc.TimeoutSeconds = int32(timeout)
	hc.BootTimeoutSeconds = int32(boot)
	p.file.HealthCheck = hc
	return nil
}

func show(v any) string {
	if s, ok := v.(string); ok {
		if len(s) > 64 {
			s = s[:64] + "..."
		}
		return strconv.Quote(s)
	}
	return kind(v)
}

// schedules parses as the runtime's scheduler does: 5 fields or an @ form.
var schedules = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// cron: [{"command": "...", "schedule": "@daily", "concurrency_policy": "forbid"}].
func (p *parser) cron(v any) error {
	list, ok := v.([]any)
	if !ok {
		return p.errorf("cron", "is %s, and it should be a list of jobs", kind(v))
	}
	if len(list) > MaxCronJobs {
		return p.errorf("cron", "has %d jobs, and an app has at most %d", len(list), MaxCronJobs)
	}
	seen := map[string]int{}
	for i, j := range list {
		path := fmt.Sprintf("cron[%d]", i)
		job, err := p.object(path, j)
		if err != nil {
			return err
		}
		var cj appv1.CronJob
		for _, k := range sortedKeys(job) {
			v := job[k]
			switch k {
			case "command":
				if cj.Command, err = p.command(path+".command", v); err != nil {
					return err
				}
			case "schedule":
				s, ok := v.(string)
				if !ok {
					return p.errorf(path+".schedule", "is %s, and it should be a cron schedule such as \"0 3 * * *\" or @daily", kind(v))
				}
				s = strings.TrimSpace(s)
				if len(s) > MaxScheduleSize {
					return p.errorf(path+".schedule", "is %d characters long, and a schedule is at most %d", len(s), MaxScheduleSize)
				}
				if strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
					return p.errorf(path+".schedule", "%s sets a time zone: schedules are in UTC, or in the app's TZ config var (config:set TZ=Europe/Paris)", show(v))
				}
				if _, err := schedules.Parse(s); err != nil || s == "" {
					return p.errorf(path+".schedule", "%s is not a cron schedule: use 5 fields such as \"0 3 * * *\" or @daily", show(v))
				}
				cj.Schedule = s
			case "concurrency_policy":
				s, _ := v.(string)
				switch strings.ToLower(s) {
				case "allow":
					cj.ConcurrencyPolicy = appv1.CronAllow
				case "forbid":
					cj.ConcurrencyPolicy = appv1.CronForbid
				case "replace":
					cj.ConcurrencyPolicy = appv1.CronReplace
				default:
					return p.errorf(path+".concurrency_policy", "%s is not a policy: use allow, forbid or replace", show(v))
				}
			default:
				p.warn("%s.%s is ignored: bex reads command, schedule and concurrency_policy", path, k)
			}
		}
		if cj.Command == "" {
			return p.errorf(path, "has no command: give one, as in {\"command\": \"./report\", \"schedule\": \"@daily\"}")
		}
		if cj.Schedule == "" {
			return p.errorf(path, "has no schedule: give one, such as \"0 3 * * *\" or @daily")
		}
		cj.ID = appv1.CronJobID(cj.Schedule, cj.Command)
		if first, dup := seen[cj.ID]; dup {
			return p.errorf(path, "is the same job as cron[%d] (same command and schedule): keep one", first)
		}
		seen[cj.ID] = i
		p.file.Cron = append(p.file.Cron, cj)
	}
	return nil
}

// scripts: {"dokku": {"predeploy": "...", "postdeploy": "..."}, "postdeploy": "..."}.
func (p *parser) scripts(v any) error {
	m, err := p.object("scripts", v)
	if err != nil {
		return err
	}
	for _, k := range sortedKeys(m) {
		v := m[k]
		switch k {
		case "dokku":
			d, err := p.object("scripts.dokku", v)
			if err != nil {
				return err
			}
			for _, dk := range sortedKeys(d) {
				switch dk {
				case "predeploy":
					if p.file.Predeploy, err = p.command("scripts.dokku.predeploy", d[dk]); err != nil {
						return err
					}
				case "postdeploy":
					if p.file.Postdeploy, err = p.command("scripts.dokku.postdeploy", d[dk]); err != nil {
						return err
					}
				default:
					p.warn("scripts.dokku.%s is ignored: bex runs dokku.predeploy and dokku.postdeploy", dk)
				}
			}
		case "postdeploy":
			// Heroku's: a command, or {"command": ..., "size": ...}.
			if o, ok := v.(map[string]any); ok {
				v = o["command"]
				if _, ok := o["command"]; !ok {
					return p.errorf("scripts.postdeploy", "has no command: give one, as in {\"command\": \"./seed\"}")
				}
				if p.file.FirstPostdeploy, err = p.command("scripts.postdeploy.command", v); err != nil {
					return err
				}
				continue
			}
			if p.file.FirstPostdeploy, err = p.command("scripts.postdeploy", v); err != nil {
				return err
			}
		default:
			p.warn("scripts.%s is ignored: bex runs dokku.predeploy, dokku.postdeploy and postdeploy", k)
		}
	}
	return nil
}
