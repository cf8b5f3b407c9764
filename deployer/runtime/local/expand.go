package local

import "strings"

// The $(NAME) expansion of commands follows the kubelet's rules, so that a command
// means the same on the local runtime and on a cluster. The algorithm is adapted
// from Kubernetes' third_party/forked/golang/expansion (Apache License 2.0,
// Copyright The Kubernetes Authors):
//
//   - $(NAME) is replaced by the variable's value when it is defined, and left as
//     it is when not;
//   - $$ is a literal $, so $$(NAME) is the text $(NAME);
//   - any other $ (a lone one, $NAME, an unterminated $( ) is kept as it is.
const (
	operator        = '$'
	referenceOpener = '('
	referenceCloser = ')'
)

// expand replaces the $(NAME) references of input with the values of vars.
func expand(input string, vars map[string]string) string {
	var buf strings.Builder
	checkpoint := 0
	for cursor := 0; cursor < len(input); cursor++ {
		if input[cursor] == operator && cursor+1 < len(input) {
			buf.WriteString(input[checkpoint:cursor])
			read, isVar, advance := tryReadVariableName(input[cursor+1:])
			if isVar {
				if v, ok := vars[read]; ok {
					buf.WriteString(v)
				} else {
					buf.WriteString(string(operator) + string(referenceOpener) + read + string(referenceCloser))
				}
			} else {
				buf.WriteString(read)
			}
			cursor += advance
			checkpoint = cursor + 1
		}
	}
	return buf.String() + input[checkpoint:]
}

// tryReadVariableName reads what follows a $: the text to copy, whether it is a
// variable name, and how many bytes it consumed.
func tryReadVariableName(input string) (string, bool, int) {
	switch input[0] {
	case operator:
		return input[0:1], false, 1
	case referenceOpener:
		for i := 1; i < len(input); i++ {
			if input[i] == referenceCloser {
				return input[1:i], true, i + 1
			}
		}
		return string(operator) + string(referenceOpener), false, 1
	default:
		return string(operator) + string(input[0]), false, 1
	}
}
