package audit

import (
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// Caps of the fields' lengths, in bytes, "…" included.
const (
	maxReason     = 500
	maxError      = 1000
	maxDetail     = 200 // each Details value, and each key
	maxDetailKeys = 20
	maxField      = 200 // every other string
	ellipsis      = "…"
)

// clean returns e with every string cleaned and capped and Outcome "ok" when
// empty. Details is a new map: the caller's is not changed. When it has more
// than maxDetailKeys keys, the first in sorted order are kept, so the same
// facts are kept each time.
func clean(e Entry) Entry {
	e.User = cleanString(e.User, maxField)
	e.Via = cleanString(e.Via, maxField)
	e.Token = cleanString(e.Token, maxField)
	e.Client = cleanString(e.Client, maxField)
	e.Command = cleanString(e.Command, maxField)
	e.App = cleanString(e.App, maxField)
	e.Database = cleanString(e.Database, maxField)
	e.Reason = cleanString(e.Reason, maxReason)
	e.Outcome = cleanString(e.Outcome, maxField)
	if e.Outcome == "" {
		e.Outcome = "ok"
	}
	e.Error = cleanString(e.Error, maxError)
	if len(e.Details) == 0 {
		e.Details = nil
		return e
	}
	d := make(map[string]string, min(len(e.Details), maxDetailKeys))
	for k, v := range e.Details {
		d[cleanString(k, maxDetail)] = cleanString(v, maxDetail)
	}
	if len(d) > maxDetailKeys {
		for _, k := range slices.Sorted(maps.Keys(d))[maxDetailKeys:] {
			delete(d, k)
		}
	}
	e.Details = d
	return e
}

// cleanString replaces invalid UTF-8 by U+FFFD and control characters by a
// space, then caps s at max bytes.
func cleanString(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexFunc(s, isControl) >= 0 {
		s = strings.Map(func(r rune) rune {
			if isControl(r) {
				return ' '
			}
			return r
		}, s)
	}
	return capString(s, max)
}

// isControl says whether r would act on a terminal or on how the text around
// it is shown rather than be shown itself: C0 (newlines and escapes among
// them), DEL, C1, the Unicode bidi embeddings, overrides and isolates (which
// reorder what follows, as in "Trojan Source"), and the line and paragraph
// separators (which end a line where a reader expects one).
func isControl(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// capString cuts s to at most max bytes, on a rune boundary, ending it with
// "…" when it was cut.
func capString(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
