// Package tools is not a command: it has no main.go.
package tools
