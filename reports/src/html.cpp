// The HTML side of a report: the Markdown attncheck writes, turned into self-contained pages (inline SVG,
// inline style, no scripts, nothing fetched), so one run can be browsed offline from index.html.
#include <string>
#include <vector>

#include "render_common.hpp"

namespace attncheck::reports {
using namespace detail;
namespace {

std::string html_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A relative link to a Markdown report goes to the HTML page rendered beside it.
std::string page_link(std::string href) {
  if (href.find("://") == std::string::npos && href.ends_with(".md")) href.replace(href.size() - 3, 3, ".html");
  return href;
}

// Replaces each pair `mark`...`mark` (non-empty, not starting or ending in a space) by <tag>...</tag>.
std::string emphasis(const std::string& s, const std::string& mark, const char* tag) {
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t open = s.find(mark, pos);
    if (open == std::string::npos) break;
    const std::size_t close = s.find(mark, open + mark.size());
    const std::size_t inner = open + mark.size();
    if (close == std::string::npos || close == inner || s[inner] == ' ' || s[close - 1] == ' ') {
      out += s.substr(pos, inner - pos);
      pos = inner;
      continue;
    }
    out += s.substr(pos, open - pos) + "<" + tag + ">" + s.substr(inner, close - inner) + "</" + tag + ">";
    pos = close + mark.size();
  }
  return out + s.substr(pos);
}

// [text](href) links in already escaped text; other brackets ("q[0,0,1]") stay as they are.
std::string links(const std::string& s) {
  std::string out;
  std::size_t pos = 0;
  for (std::size_t open; (open = s.find('[', pos)) != std::string::npos;) {
    const std::size_t mid = s.find(']', open);
    const std::size_t close = mid == std::string::npos ? mid : s.find(')', mid);
    if (close == std::string::npos || s[mid + 1] != '(' || s.find('[', open + 1) < mid) {
      out += s.substr(pos, open + 1 - pos);
      pos = open + 1;
      continue;
    }
    out += s.substr(pos, open - pos) + "<a href=\"" + page_link(s.substr(mid + 2, close - mid - 2)) + "\">" +
           s.substr(open + 1, mid - open - 1) + "</a>";
    pos = close + 1;
  }
  return out + s.substr(pos);
}

// Inline Markdown. Code spans are set aside first (nothing inside one is markup, and a link or emphasis may
// contain one), then links, **bold** and *italics*; "\|" is a literal bar (table cells escape it).
std::string inline_html(std::string_view text) {
  std::vector<std::string> codes;
  std::string plain;
  bool code = false;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t tick = std::min(text.find('`', pos), text.size());
    std::string part(text.substr(pos, tick - pos));
    for (std::size_t at; (at = part.find("\\|")) != std::string::npos;) part.replace(at, 2, "|");
    if (code) {
      plain += "\x01" + std::to_string(codes.size()) + "\x02";  // a placeholder no markup can match
      codes.push_back("<code>" + html_escape(part) + "</code>");
    } else {
      plain += part;
    }
    code = !code;
    pos = tick + 1;
  }
  const std::string marked = emphasis(emphasis(links(html_escape(plain)), "**", "strong"), "*", "em");
  std::string out;
  for (std::size_t pos = 0; pos < marked.size();) {
    if (marked[pos] != '\x01') {
      out += marked[pos++];
      continue;
    }
    const std::size_t end = marked.find('\x02', pos);
    out += codes[std::stoul(marked.substr(pos + 1, end - pos - 1))];
    pos = end + 1;
  }
  return out;
}

// The cells of a table row "| a | b \| c |".
std::vector<std::string> table_cells(std::string_view line) {
  std::vector<std::string> cells;
  std::string cur;
  for (std::size_t n = 1; n < line.size(); ++n) {
    if (line[n] == '\\' && n + 1 < line.size() && line[n + 1] == '|') {
      cur += "\\|";
      ++n;
    } else if (line[n] == '|') {
      const auto first = cur.find_first_not_of(' '), last = cur.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? "" : cur.substr(first, last - first + 1));
      cur.clear();
    } else {
      cur += line[n];
    }
  }
  return cells;
}

// The class of a cell that says a verdict, so that each has its colour (the page's style): falsified (a run's
// "**falsified**", an overview's "[✗](law.html) shape"), held ("held", "✓"), not checked ("**not checked**", "?")
// and not applicable ("n/a"); "" for any other cell.
std::string_view verdict_class(std::string_view cell) {
  if (cell == "**falsified**" || cell.starts_with("[✗]") || cell == "✗") return "falsified";
  if (cell == "held" || cell == "✓") return "held";
  if (cell == "**not checked**" || cell == "?") return "unchecked";
  if (cell == "n/a") return "na";
  return "";
}

std::string table_html(const std::vector<std::string_view>& lines) {
  const std::vector<std::string> header = table_cells(lines[0]);
  const std::vector<std::string> rule = lines.size() > 1 ? table_cells(lines[1]) : std::vector<std::string>{};
  const auto align = [&](std::size_t n) {
    return n < rule.size() && rule[n].ends_with(":") ? std::string(" class=\"num\"") : std::string();
  };
  const auto cell_class = [&](std::size_t n, std::string_view cell) {
    const std::string_view verdict = verdict_class(cell);
    return verdict.empty() ? align(n) : " class=\"" + std::string(verdict) + "\"";
  };
  std::string h = "<table>\n";
  bool any_header = false;
  for (const auto& c : header) any_header = any_header || !c.empty();
  if (any_header) {
    h += "<thead><tr>";
    for (std::size_t n = 0; n < header.size(); ++n) h += "<th" + align(n) + ">" + inline_html(header[n]) + "</th>";
    h += "</tr></thead>\n";
  }
  h += "<tbody>\n";
  for (std::size_t r = 2; r < lines.size(); ++r) {
    const auto cells = table_cells(lines[r]);
    h += "<tr>";
    for (std::size_t n = 0; n < cells.size(); ++n)
      h += "<td" + cell_class(n, cells[n]) + ">" + inline_html(cells[n]) + "</td>";
    h += "</tr>\n";
  }
  return h + "</tbody>\n</table>\n";
}

// "![alt](file)" alone on a line: the SVG inline when it is one of the run's pictures.
std::string image_html(std::string_view line, const std::vector<ReportFile>& svgs) {
  const std::size_t mid = line.find("](");
  const std::string alt(line.substr(2, mid - 2)), src(line.substr(mid + 2, line.size() - mid - 3));
  for (const auto& f : svgs)
    if (f.name == src) return "<figure>\n" + f.content + "</figure>\n";
  return "<figure><img src=\"" + html_escape(src) + "\" alt=\"" + html_escape(alt) + "\"></figure>\n";
}

std::string heading_id(std::string_view text) {
  std::string id;
  for (const char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) id += c;
    else if (c >= 'A' && c <= 'Z') id += static_cast<char>(c - 'A' + 'a');
    else if (!id.empty() && id.back() != '-') id += '-';
  }
  while (!id.empty() && id.back() == '-') id.pop_back();
  return id;
}

}  // namespace

std::string markdown_to_html(std::string_view md, const std::vector<ReportFile>& svgs) {
  std::vector<std::string_view> lines;
  for (std::size_t pos = 0; pos < md.size();) {
    const std::size_t end = std::min(md.find('\n', pos), md.size());
    lines.push_back(md.substr(pos, end - pos));
    pos = end + 1;
  }
  std::string h;
  for (std::size_t n = 0; n < lines.size();) {
    const std::string_view line = lines[n];
    if (line.empty()) {
      ++n;
    } else if (line.starts_with("#")) {
      const std::size_t level = std::min<std::size_t>(line.find_first_not_of('#'), 6);
      const std::string_view text = line.substr(std::min(line.size(), level + 1));
      const std::string tag = "h" + std::to_string(level);
      h += "<" + tag + " id=\"" + heading_id(text) + "\">" + inline_html(text) + "</" + tag + ">\n";
      ++n;
    } else if (line.starts_with("> ")) {
      h += "<blockquote>" + inline_html(line.substr(2)) + "</blockquote>\n";
      ++n;
    } else if (line.starts_with("|")) {
      std::vector<std::string_view> rows;
      while (n < lines.size() && lines[n].starts_with("|")) rows.push_back(lines[n++]);
      h += table_html(rows);
    } else if (line.starts_with("- ")) {
      h += "<ul>\n";
      while (n < lines.size() && lines[n].starts_with("- ")) {
        h += "<li>" + inline_html(lines[n++].substr(2));
        while (n < lines.size() && lines[n].starts_with("  ")) h += "<br>" + inline_html(lines[n++].substr(2));
        h += "</li>\n";
      }
      h += "</ul>\n";
    } else if (line.starts_with("![") && line.ends_with(")") && line.find("](") != std::string_view::npos) {
      h += image_html(line, svgs);
      ++n;
    } else {
      // A paragraph: this line whatever it starts with (a "![" that is no image, say: without taking it the
      // loop would never advance, as fuzz_report_writers found), then the lines up to the next block.
      h += "<p>" + inline_html(lines[n++]);
      while (n < lines.size() && !lines[n].empty() && !lines[n].starts_with("|") && !lines[n].starts_with("#") &&
             !lines[n].starts_with("!["))
        h += "\n" + inline_html(lines[n++]);
      h += "</p>\n";
    }
  }
  return h;
}

std::string html_page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         // Nothing may be fetched or run: the page is complete as written, and works offline.
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
         "<title>" + html_escape(title) + "</title>\n"
         "<style>\n"
         "body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }\n"
         "h1 { font-size: 1.5em; } h2 { font-size: 1.25em; margin-top: 1.6em; } h3 { font-size: 1.1em; }\n"
         "table { border-collapse: collapse; margin: 0.8em 0; display: block; overflow-x: auto; max-width: 100%; }\n"
         "th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }\n"
         "th { background: #f3f3f3; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }\n"
         // A long path in prose may wrap where it must; a law's name in a table never breaks inside a word.
         "code { background: #f3f3f3; padding: 0.1em 0.3em; border-radius: 3px; overflow-wrap: break-word; }\n"
         "td code { white-space: nowrap; }\n"
         // The verdicts, each its colour (and its word or sign, for a reader who does not see colour).
         "td.falsified { background: #fde0dc; color: #a50e0e; font-weight: 600; } td.falsified a { color: #a50e0e; }\n"
         "td.held { background: #e6f4ea; color: #137333; }\n"
         "td.unchecked { background: #fef7e0; color: #8a5a00; font-weight: 600; }\n"
         "td.na { color: #999; }\n"
         "blockquote { border-left: 4px solid #d62728; margin: 1em 0; padding: 0.4em 1em; background: #fdf3f3; }\n"
         "figure { margin: 1em 0; overflow-x: auto; } figure svg { max-width: 100%; height: auto; }\n"
         "nav { margin-bottom: 1em; }\n"
         "</style>\n</head>\n<body>\n" +
         body + "</body>\n</html>\n";
}

}  // namespace attncheck::reports
