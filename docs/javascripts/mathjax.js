// The notebooks' equations, typeset by MathJax 3 served from this site (javascripts/mathjax/,
// vendored: see its README.txt), so that a page asks no other host for anything.
// mkdocs.yml's custom_mathjax_url puts this script on every notebook page. The delimiters are
// Jupyter's ($...$, $$...$$, \(...\), \[...\]; \$ is a dollar sign), as the notebooks were
// written; MathJax 2's configuration that nbconvert writes beside it is inert under MathJax 3.
(function () {
  var here = document.currentScript.src;
  window.MathJax = {
    loader: {paths: {mathjax: new URL("mathjax", here).href}},
    tex: {
      inlineMath: [["$", "$"], ["\\(", "\\)"]],
      displayMath: [["$$", "$$"], ["\\[", "\\]"]],
      processEscapes: true,
      processEnvironments: true,
      tags: "ams",
    },
    // The menu's accessibility entries would load components that are not vendored.
    options: {enableMenu: false},
    startup: {
      // <html data-mathjax="typeset"> once the page's equations are typeset (tests/test_docs.py
      // waits for it)
      pageReady: function () {
        return MathJax.startup.defaultPageReady().then(function () {
          document.documentElement.dataset.mathjax = "typeset";
        });
      },
    },
  };
  var script = document.createElement("script");
  script.src = new URL("mathjax/tex-chtml.js", here).href;
  script.async = true;
  document.head.appendChild(script);
})();
