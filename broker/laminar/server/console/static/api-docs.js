"use strict";
// The API page: Swagger UI (served by the broker from the swagger-ui-py package) over the
// broker's own OpenAPI document. No validator badge: it would load from another site.
document.addEventListener("DOMContentLoaded", function () {
  const root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.spec,
    domNode: root,
    validatorUrl: null,
    deepLinking: false,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
