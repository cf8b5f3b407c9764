//= link_tree ../stylesheets .css
