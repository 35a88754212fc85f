// qkgeom tests — a minimal XML well-formedness checker and the readers of
// SVG marks (start tags by element and class, attribute values). Shared by
// report_svg_test.cpp (which also tests the checker itself) and
// study_report_test.cpp.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom_test {

// --- a minimal XML well-formedness checker ----------------------------------
// Prolog/comments, start/end/empty tags with a matching stack, attributes
// quoted and unique, no raw '<' in values, '&' only as a known or numeric
// entity, exactly one root element.

/// \returns whether `c` may appear in an element or attribute name.
inline bool xml_name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == ':' || c == '.';
}

/// \param[in] text character data or an attribute value.
/// \returns "" when it holds no raw '<' and every '&' starts a known or numeric entity; else the fault.
inline std::string xml_entity_error(std::string_view text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '<') return "raw '<' in text or attribute";
        if (text[i] != '&') continue;
        auto const semi = text.find(';', i);
        if (semi == std::string_view::npos) return "unterminated entity";
        auto const ent = text.substr(i + 1, semi - i - 1);
        bool const ok = ent == "amp" || ent == "lt" || ent == "gt" || ent == "quot" || ent == "apos" ||
                        (ent.size() > 1 && ent[0] == '#');
        if (!ok) return "unknown entity &" + std::string(ent) + ";";
        i = semi;
    }
    return "";
}

/// The attributes of a start tag, from just after its name to its '>'.
/// \param[in] s the document.
/// \param[in,out] j in: the index after the name; out: the index of the closing '>'.
/// \param[in] name the element's name (for messages).
/// \param[out] empty set when the tag ends with "/>".
/// \returns "" when the attributes are well-formed; else the fault.
inline std::string xml_tag_error(std::string_view s, std::size_t& j, std::string const& name, bool& empty) {
    std::vector<std::string> attrs;
    for (;;) {
        while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j])) != 0) ++j;
        if (j >= s.size()) return "unterminated tag <" + name;
        if (s[j] == '>') return "";
        if (s.substr(j, 2) == "/>") {
            empty = true;
            ++j;
            return "";
        }
        std::size_t const a0 = j;
        while (j < s.size() && xml_name_char(s[j])) ++j;
        std::string const an(s.substr(a0, j - a0));
        if (an.empty() || j >= s.size() || s[j] != '=') return "bad attribute in <" + name;
        ++j;
        if (j >= s.size() || (s[j] != '"' && s[j] != '\'')) return "unquoted attribute " + an;
        auto const e = s.find(s[j], j + 1);
        if (e == std::string_view::npos) return "unterminated attribute " + an;
        if (auto err = xml_entity_error(s.substr(j + 1, e - j - 1)); !err.empty()) return err + " in " + an;
        for (auto const& a : attrs)
            if (a == an) return "duplicate attribute " + an;
        attrs.push_back(an);
        j = e + 1;
    }
}

/// \param[in] s a whole XML document.
/// \returns "" when `s` is well-formed (in the sense above); else the first fault found.
inline std::string xml_error(std::string_view s) {
    std::vector<std::string> stack;
    int roots = 0;
    for (std::size_t i = 0; i < s.size();) {
        if (s[i] != '<') {
            auto const next = std::min(s.find('<', i), s.size());
            auto const text = s.substr(i, next - i);
            if (stack.empty() && text.find_first_not_of(" \t\r\n") != std::string_view::npos)
                return "text outside the root element";
            if (auto e = xml_entity_error(text); !e.empty()) return e;
            i = next;
            continue;
        }
        bool const comment = s.substr(i, 4) == "<!--", pi = s.substr(i, 2) == "<?";
        if (comment || pi) {
            auto const e = s.find(comment ? "-->" : "?>", i);
            if (e == std::string_view::npos) return comment ? "unterminated comment" : "unterminated processing instruction";
            i = e + (comment ? 3 : 2);
            continue;
        }
        bool const closing = s.substr(i, 2) == "</";
        std::size_t j = i + (closing ? 2 : 1);
        std::size_t const n0 = j;
        while (j < s.size() && xml_name_char(s[j])) ++j;
        std::string const name(s.substr(n0, j - n0));
        if (name.empty()) return "tag without a name at " + std::to_string(i);
        if (closing) {
            while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j])) != 0) ++j;
            if (j >= s.size() || s[j] != '>') return "bad end tag </" + name;
            if (stack.empty() || stack.back() != name)
                return "end tag </" + name + "> does not match <" + (stack.empty() ? "" : stack.back()) + ">";
            stack.pop_back();
        } else {
            bool empty = false;
            if (auto e = xml_tag_error(s, j, name, empty); !e.empty()) return e;
            if (stack.empty() && ++roots > 1) return "more than one root element";
            if (!empty) stack.push_back(name);
        }
        i = j + 1;
    }
    if (!stack.empty()) return "unclosed <" + stack.back() + ">";
    return roots == 1 ? "" : "no root element";
}

// --- reading elements back -------------------------------------------------

/// \param[in] svg the document.
/// \param[in] name the element's name.
/// \param[in] cls the class wanted (class="cls"), or "" for any.
/// \returns every start tag of element `name` with that class, as the text from '<' to '>'.
inline std::vector<std::string> elements(std::string const& svg, std::string const& name, std::string const& cls = "") {
    std::vector<std::string> out;
    std::string const open = "<" + name + " ";
    for (auto p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
        auto const e = svg.find('>', p);
        std::string tag = svg.substr(p, e - p + 1);
        if (cls.empty() || tag.find("class=\"" + cls + "\"") != std::string::npos) out.push_back(tag);
    }
    return out;
}

/// \param[in] tag a start tag (as elements() returns it).
/// \param[in] a the attribute's name.
/// \returns the attribute's value as written (entities not decoded), or "" when absent.
inline std::string attr(std::string const& tag, std::string const& a) {
    auto const k = tag.find(" " + a + "=\"");
    if (k == std::string::npos) return "";
    auto const b = k + a.size() + 3;
    return tag.substr(b, tag.find('"', b) - b);
}

}  // namespace qkgeom_test
