// Package untrusted prepares what an app or its build printed for an AI agent.
//
// Everything an app's processes and its build steps write is the tenant's, and
// an agent's model reads it as text: a log line can carry terminal escapes that
// hide or rewrite what a person sees, invisible Unicode that reorders it, an
// instruction aimed at the model ("ignore all previous instructions"), or the
// app's own secrets, printed by mistake. Before the agents' API hands such text
// on, it goes through three steps, in this order:
//
//   - Clean drops ANSI escape sequences (CSI, OSC, DCS and the rest, in their
//     7-bit and 8-bit forms) and every other control or format character
//     (bidirectional overrides, zero-width characters), keeping newlines and
//     tabs; a carriage return becomes a newline, so nothing overwrites a line;
//     bytes that are not UTF-8 become U+FFFD.
//   - A Redactor replaces each of the app's config values of MinSecret or more
//     characters with "[redacted: NAME]", also where the value appears
//     URL-escaped or in base64, after Clean so that an escape sequence spliced
//     into a value cannot hide it.
//   - Frame puts the result in a block that says whose output it is and that it
//     is data, not instructions, with a boundary the text cannot forge: a line
//     of the text that would close the block is changed so that it does not.
//
// The owner reading their own logs over ssh gets them unchanged; this package is
// for the agents' API only.
package untrusted
