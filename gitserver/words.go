package gitserver

import (
	"errors"
	"strings"
)

// SplitCommand splits the command of an SSH session into words the way a POSIX shell
// splits a simple command, and does nothing else: no variable, command or tilde
// expansion, no globbing, no operators. OpenSSH sends the words the user typed joined
// by spaces, as one string meant for a remote shell; bex has no shell, so quoting is
// the only shell syntax it honours and everything else is data.
//
//   - Blanks (space, tab, newline) separate words.
//   - 'single quotes' keep everything up to the next ' literally.
//   - "double quotes" keep everything literally except that \ escapes $ ` " \ and
//     newline (and a \ before a newline removes both), as in a shell.
//   - \ outside quotes keeps the next character literally; \ before a newline
//     removes both.
//   - ” and "" make an empty word.
//
// ; | & < > $( ) ` * ~ are ordinary characters. An unterminated quote is an error. github.com/anmitsu/go-shlex, which gliderlabs/ssh's Command() uses,
// differs: it drops empty words, keeps the \ of \$ inside double quotes and ignores
// an unterminated quote.
func SplitCommand(s string) ([]string, error) {
	var (
		words []string
		w     strings.Builder
		inW   bool // a word has started (it may be empty: '')
	)
	end := func() {
		if inW {
			words = append(words, w.String())
			w.Reset()
			inW = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case ' ', '\t', '\n':
			end()
		case '\\':
			if i+1 >= len(s) {
				w.WriteByte(c) // a trailing \ stays, as in sh
				inW = true
				continue
			}
			i++
			if s[i] == '\n' {
				continue // line continuation
			}
			w.WriteByte(s[i])
			inW = true
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("the command has a ' that is not closed")
			}
			w.WriteString(s[i+1 : i+1+j])
			inW = true
			i += j + 1
		case '"':
			inW = true
			i++
			for ; ; i++ {
				if i >= len(s) {
					return nil, errors.New(`the command has a " that is not closed`)
				}
				if s[i] == '"' {
					break
				}
				if s[i] == '\\' && i+1 < len(s) {
					switch s[i+1] {
					case '$', '`', '"', '\\':
						i++
					case '\n':
						i++
						continue
					}
				}
				w.WriteByte(s[i])
			}
		default:
			w.WriteByte(c)
			inW = true
		}
	}
	end()
	return words, nil
}
