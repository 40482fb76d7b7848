// The console's only script: confirm an action before its form is posted.
document.addEventListener("submit", (event) => {
  const question = event.target.dataset.question;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
