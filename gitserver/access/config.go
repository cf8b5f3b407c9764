package access

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults of Config.
const (
	// DefaultNamespace is where Apps live when Config names no namespace.
	DefaultNamespace = "default"
)

// Config configures a Kube directory. DefaultConfig gives the defaults, and a zero
// field means its default (the zero Config is valid): New and Validate fill them in.
type Config struct {
	// Namespace is the namespace the Apps live in. Default DefaultNamespace.
	Namespace string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	return c
}

// Validate reports every problem of c, its zero fields taken as their defaults,
// each naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("Config.Namespace %q: %s", c.Namespace, strings.Join(msgs, "; ")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("access config: %w", err)
	}
	return nil
}
